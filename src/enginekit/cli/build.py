"""enginekit build: a model name or ONNX file -> a cached TensorRT engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import (declares_a_model, PANEL_BUILD, PANEL_GATES, PANEL_REPORTS, PANEL_RUN, ImgszOpt, ProfileOpt, builds_an_engine, engine_request, NmsOpt, ForceOpt, RandomInitOpt, RemoteOpt, RemoteReadOnlyOpt, SeedOpt, TrustOpt, WeightsOpt,
                                  handles_errors, quiet_third_party)


def register(app: typer.Typer) -> None:
    @app.command("build")
    @handles_errors
    @declares_a_model
    @builds_an_engine
    def build_cmd(
        target: Annotated[str, typer.Argument(help="A model (as export's), an ONNX file, or a recipe .yaml (flags override its keys).")],
        profile: ProfileOpt = None,
        imgsz: ImgszOpt = None,
        precision: Annotated[str, typer.Option("--precision", rich_help_panel=PANEL_BUILD, help="fp32, fp16, int8 or fp8 (in the graph: docs/export-build.md).")] = "fp32",
        weights: WeightsOpt = None,
        trust_checkpoint: TrustOpt = False,
        random_init: RandomInitOpt = False,
        seed: SeedOpt = 0,
        nms: NmsOpt = False,
        explain: Annotated[bool, typer.Option("--explain", rich_help_panel=PANEL_RUN, help="Hit or miss, and which part of the key changed.")] = False,
        no_verify: Annotated[bool, typer.Option("--no-verify", rich_help_panel=PANEL_GATES, help="Skip the parity check the manifest records.")] = False,
        repair: Annotated[bool, typer.Option("--repair", rich_help_panel=PANEL_GATES, help="fp16/int8 failing its gate: fewest nodes back to FP32.")] = False,
        tol: Annotated[Optional[list[str]], typer.Option("--tol", rich_help_panel=PANEL_GATES, help="The limits the build (and --repair) judge the graph by: int8.recall=0.9 (repeatable).")] = None,
        accept_failed: Annotated[bool, typer.Option("--accept-failed", rich_help_panel=PANEL_GATES, help="Build from a graph that failed a check (the engine records it; it stays failed).")] = False,
        images: Annotated[Optional[Path], typer.Option("--images", rich_help_panel=PANEL_GATES, help="Photographs the build judges its graph on (default: --calib-data's images it did not calibrate on, else embedded).")] = None,
        output: Annotated[Optional[Path], typer.Option("--output", "-o", rich_help_panel=PANEL_REPORTS, help="Also copy the plan here.")] = None,
        ultralytics_metadata: Annotated[bool, typer.Option("--ultralytics-metadata", rich_help_panel=PANEL_REPORTS, help="The copy with Ultralytics' header, for YOLO(NAME.engine).")] = False,
        force: ForceOpt = False,
        as_json: Annotated[bool, typer.Option("--json", rich_help_panel=PANEL_REPORTS, help="Print what was made (paths, cache keys) as JSON.")] = False,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
        engine: dict = {},
        declared: dict = None,
    ) -> None:
        """Build a TensorRT engine (strongly typed: precision lives in the graph), cached by content.

        Prints the engine path. A second identical build is a cache hit: no export, no calibration, no build. docs/export-build.md says more.

        Examples:

          enginekit build yolo12n --random-init --precision fp16

          enginekit build best.pt -p 1x3x640x640:8x3x640x640:16x3x640x640

          enginekit build depth --random-init --imgsz 392 --precision fp16

          enginekit build model.onnx --imgsz 640 --precision int8 --calib-data imgs/

          enginekit build yolo12n --random-init --trt tensorrt-rtx --target-cc 8.6,8.9
        """
        if target.endswith((".yaml", ".yml")):  # a recipe: every precision x target set in it
            from enginekit.cli.recipes import build_recipe_cmd

            return build_recipe_cmd(target, {**locals(), **engine})
        from enginekit import api
        from enginekit.fsutil import check_output_path
        from enginekit.requests import BuildRequest

        if ultralytics_metadata and output is None:  # as Ultralytics names its engines: beside, after the model
            output = Path.cwd() / f"{Path(target).stem if Path(target).suffix else target}.engine"
        check_output_path(output, "--output")
        request = BuildRequest(
            target=target, profiles=profile or [], imgsz=imgsz, precision=precision, **engine_request(engine), weights=weights,
            random_init=random_init, seed=seed, explain=explain, verify=not no_verify, force=force,
            repair=repair, tolerances=tol or [], nms=nms, declared=declared, images=images, accept_failed=accept_failed,
        )
        quiet_third_party()
        outcome = api.build(request)
        from rich.markup import escape

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
        made = outcome.made() + ([{"what": "engine copy", "path": str(output), "key": outcome.entry.key}]
                                 if output is not None else [])
        if as_json:
            from enginekit.fsutil import json_text

            emit(json_text({"engine": str(output or outcome.engine), "status": outcome.status, "made": made}, indent=2))
            return
        console.print("made:", highlight=False)
        for row in made:
            key = f"  [dim]{row['key'][:12]}[/]" if row["key"] else ""
            console.print(f"  {row['what']:<22} {escape(row['path'])}{key}", highlight=False, soft_wrap=True)
        emit(str(output or outcome.engine))
