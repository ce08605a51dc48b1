"""enginekit build: a model name or ONNX file -> a cached TensorRT engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import (BgrOpt, ClassesOpt, DynamicOpt, MeanOpt, MODEL_HELP, OutputsOpt, ResizeOpt, SizeOpt, StdOpt, TaskOpt, declared_of, NmsOpt, ForceOpt, RandomInitOpt, RemoteOpt, RemoteReadOnlyOpt, SeedOpt, TrustOpt, WeightsOpt,
                                  handles_errors, quiet_third_party)


def register(app: typer.Typer) -> None:
    @app.command("build")
    @handles_errors
    def build_cmd(
        target: Annotated[str, typer.Argument(help=MODEL_HELP.replace("Model:", "Model (or an ONNX file, or a recipe .yaml whose keys flags override):", 1))],
        profile: Annotated[Optional[list[str]], typer.Option("--profile", "-p", help="NxCxHxW or min:opt:max (name=... for several inputs); repeat for several optimization profiles.")] = None,
        precision: Annotated[str, typer.Option("--precision", help="fp32, fp16 (ModelOpt AutoCast), int8 or fp8 (ModelOpt Q/DQ; fp8 needs targets >= 8.9).")] = "fp32",
        backend: Annotated[str, typer.Option("--backend", help="auto, tensorrt or tensorrt-rtx.")] = "auto",
        target_cc: Annotated[Optional[str], typer.Option("--target-cc", help="TensorRT-RTX compute capabilities, e.g. 8.6,8.9,12.0 (default: this GPU, else all portable ones).")] = None,
        workspace: Annotated[Optional[str], typer.Option("--workspace", help="Builder workspace limit, e.g. 4G.")] = None,
        opt_level: Annotated[Optional[int], typer.Option("--opt-level", help="Builder optimization level 0..5.")] = None,
        calib_data: Annotated[Optional[Path], typer.Option("--calib-data", help="INT8: an image folder, a dataset YAML (its train split), a video (frames sampled evenly) or a .npy/.npz (default: embedded photographs).")] = None,
        calib_count: Annotated[int, typer.Option("--calib-count", help="INT8: number of calibration inputs.")] = 8,
        calib_method: Annotated[Optional[str], typer.Option("--calib-method", help="INT8 calibration method (default: the family's: max for YOLO, entropy otherwise).")] = None,
        calib_cache: Annotated[Optional[Path], typer.Option("--calib-cache", help="INT8: calibration cache to read (if it exists) or write.")] = None,
        exclude: Annotated[Optional[list[str]], typer.Option("--exclude", help="INT8: node-name regex kept out of quantization (repeatable).")] = None,
        weights: WeightsOpt = None,
        trust_checkpoint: TrustOpt = False,
        random_init: RandomInitOpt = False,
        seed: SeedOpt = 0,
        nms: NmsOpt = False,
        explain: Annotated[bool, typer.Option("--explain", help="Say hit or miss, and which part of the key changed.")] = False,
        no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip the parity check recorded in the manifest.")] = False,
        repair: Annotated[bool, typer.Option("--repair", help="fp16/int8: if the parity gate fails, keep the fewest offending nodes in FP32 and rebuild.")] = False,
        tol: Annotated[Optional[list[str]], typer.Option("--tol", help="Gate tolerance for --repair: rel_l2=1e-4, fp16.cosine=0.9999 (repeatable).")] = None,
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Also copy the plan here.")] = None,
        ultralytics_metadata: Annotated[bool, typer.Option("--ultralytics-metadata", help="The copy (-o, default NAME.engine here) starts with Ultralytics' header (length, JSON: task, names, stride, imgsz...) so YOLO(\"NAME.engine\") loads it; the cache keeps the bare plan.")] = False,
        force: ForceOpt = False,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
        task: TaskOpt = None,
        outputs: OutputsOpt = None,
        size: SizeOpt = None,
        dynamic: DynamicOpt = None,
        mean: MeanOpt = None,
        std: StdOpt = None,
        resize: ResizeOpt = None,
        bgr: BgrOpt = False,
        classes: ClassesOpt = None,
    ) -> None:
        """Build a TensorRT engine (strongly typed; precision lives in the ONNX graph), cached by content.

        Prints the engine path. A second identical build is a cache hit: no export, no calibration, no build.

        Examples:

          enginekit build yolo12n --random-init --precision fp16 --profile 1x3x640x640:8x3x640x640:16x3x640x640

          enginekit build depth --random-init --profile 1x3x392x392 --precision fp16

          enginekit build model.onnx --profile 1x3x640x640 --precision int8 --calib-data images/ --calib-cache yolo.calib

          enginekit build yolo12n --random-init --backend tensorrt-rtx --target-cc 8.6,8.9,12.0

          enginekit build torchvision:deeplabv3_resnet50 -w deeplab.pt --precision int8 --profile 1x3x512x512:4x3x512x512:8x3x512x512
        """
        if target.endswith((".yaml", ".yml")):  # a recipe: every precision x target set in it
            from enginekit.cli.recipes import build_recipe_cmd

            return build_recipe_cmd(target, locals())
        from enginekit import api
        from enginekit.fsutil import check_output_path
        from enginekit.requests import BuildRequest

        if ultralytics_metadata and output is None:  # as Ultralytics names its engines: beside, after the model
            output = Path.cwd() / f"{Path(target).stem if Path(target).suffix else target}.engine"
        check_output_path(output, "--output")
        request = BuildRequest(
            target=target, profiles=profile or [], precision=precision, backend=backend, target_cc=target_cc,
            workspace=workspace, opt_level=opt_level, calib_data=calib_data, calib_count=calib_count,
            calib_method=calib_method, calib_cache=calib_cache, exclude=exclude or [], weights=weights,
            random_init=random_init, seed=seed, explain=explain, verify=not no_verify, force=force,
            repair=repair, tolerances=tol or [], nms=nms, declared=declared_of(locals()),
        )
        quiet_third_party()
        outcome = api.build(request)
        from enginekit.cli.render import console, emit

        parity = outcome.manifest.get("parity", {})
        checked = json.loads((outcome.engine.parent / "parity.json").read_text())
        if checked.get("checked") is False and checked.get("reason"):
            console.print(f"[yellow]note:[/] parity not checked at build: {checked['reason']}")
        elif checked.get("status") == "not-checked":  # an output the same for every input: nothing compared
            for note in (checked.get("report") or {}).get("notes", []):
                console.print(f"[yellow]note:[/] {note}")
        if parity.get("passed") is False:
            console.print("[yellow]warning:[/] the graph this engine was built from failed its parity check "
                          "(see parity.json; `enginekit verify` gates on it)")
        if output is not None:
            from enginekit.flows.build import write_engine_file

            write_engine_file(outcome, output, ultralytics=ultralytics_metadata)
        emit(str(output or outcome.engine))
