"""enginekit deploy triton: a Triton Inference Server model repository for a model enginekit built and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import (PANEL_BUILD, PANEL_GATES, PANEL_RUN, WeightsOpt, ImgszOpt, RandomInitOpt,
                                  RemoteOpt, RemoteReadOnlyOpt, SeedOpt, declares_a_model, handles_errors,
                                  quiet_third_party)

PANEL_SERVING = "Serving"


def register(app: typer.Typer) -> None:
    deploy_app = typer.Typer(help="Serve what enginekit built: a model repository for an inference server.",
                             no_args_is_help=True)
    app.add_typer(deploy_app, name="deploy")

    @deploy_app.command("triton")
    @handles_errors
    @declares_a_model
    def triton_cmd(
        target: Annotated[str, typer.Argument(help="A model name or recipe (exported through the cache), or an ONNX file enginekit wrote.")],
        repo: Annotated[Path, typer.Option("--repo", help="The model repository folder (made if missing; other models in it are kept).")],
        weights: WeightsOpt = None,
        random_init: RandomInitOpt = False,
        seed: SeedOpt = 0,
        imgsz: ImgszOpt = None,
        platform: Annotated[str, typer.Option("--platform", rich_help_panel=PANEL_SERVING, help="How the server runs the network: onnxruntime, tensorrt, or python (enginekit's runtime in Triton's Python backend).")] = "onnxruntime",
        precision: Annotated[str, typer.Option("--precision", rich_help_panel=PANEL_BUILD, help="fp32 or fp16 (tensorrt: also int8, fp8).")] = "fp32",
        profile: Annotated[Optional[list[str]], typer.Option("--profile", rich_help_panel=PANEL_BUILD, help="tensorrt: the engine's MIN:OPT:MAX shapes (default 1 to --max-batch).")] = None,
        name: Annotated[Optional[str], typer.Option("--name", rich_help_panel=PANEL_SERVING, help="The model's name in the server (default: the model's); the network is NAME-net.")] = None,
        max_batch: Annotated[int, typer.Option("--max-batch", rich_help_panel=PANEL_SERVING, help="Most requests the server gathers into one network call.")] = 8,
        preferred: Annotated[Optional[str], typer.Option("--preferred", rich_help_panel=PANEL_SERVING, help="Batch sizes the server waits to form, e.g. 4,8 (default: a recipe's runtime.batch).")] = None,
        queue_delay_us: Annotated[int, typer.Option("--queue-delay-us", rich_help_panel=PANEL_SERVING, help="Longest a request waits for others to batch with, in microseconds.")] = 2000,
        instances: Annotated[int, typer.Option("--instances", rich_help_panel=PANEL_SERVING, help="Copies of each model per device.")] = 1,
        python_env: Annotated[Optional[Path], typer.Option("--python-env", rich_help_panel=PANEL_SERVING, help="The environment holding enginekit the Python models run in (default: this one).")] = None,
        conf: Annotated[float, typer.Option("--conf", rich_help_panel=PANEL_GATES, help="Detection confidence threshold.")] = 0.25,
        iou: Annotated[float, typer.Option("--iou", rich_help_panel=PANEL_GATES, help="NMS IoU threshold.")] = 0.7,
        allow_unverified: Annotated[bool, typer.Option("--allow-unverified", rich_help_panel=PANEL_RUN, help="Write a network nothing verified (its README says so).")] = False,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
        declared: dict = None,
    ) -> None:
        """Write a Triton model repository: NAME-net (the network, batched by the server) and NAME (images in,
        what enginekit predict finds out), with a README on starting the server and asking it.

        The network is the cache's checked one (the export's parity gate; an engine's verify), refused
        otherwise unless --allow-unverified. The repository is a cache entry: deploying the same thing
        again does no work, and it travels through the team store.

        Examples:

          enginekit deploy triton yolo12n --random-init --repo models/

          enginekit deploy triton yolov8n -w best.pt --repo models/ --platform python --preferred 4
        """
        from enginekit.fsutil import check_output_path
        from enginekit.requests import DeployRequest

        check_output_path(repo, "--repo", folder=True)
        request = DeployRequest(target=target, repo=repo, platform=platform, precision=precision, name=name,
                                max_batch=max_batch, preferred=preferred, queue_delay_us=queue_delay_us,
                                instances=instances, imgsz=imgsz, conf=conf, iou=iou, weights=weights,
                                random_init=random_init, seed=seed, profiles=profile or [], python_env=python_env,
                                allow_unverified=allow_unverified, declared=declared)
        quiet_third_party()
        from enginekit import api
        from enginekit.cli.render import console, emit

        outcome = api.deploy(request)
        console.print(f"{outcome.name} ({outcome.platform}): {outcome.verified or 'NOT VERIFIED (--allow-unverified)'}; "
                      f"repository entry {outcome.entry.key[:12]} ({outcome.status}); models: "
                      f"{', '.join(outcome.models)}", highlight=False, markup=False)
        emit(str(outcome.repo))
