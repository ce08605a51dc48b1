"""enginekit export: PyTorch -> simplified ONNX (FP32, optionally FP16), parity-checked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import (declares_a_model, ImagesOpt, RecheckOpt, PANEL_BUILD, PANEL_GATES, PANEL_INPUT, PANEL_REPORTS, ImgszOpt, OpsetOpt, MODEL_HELP, NmsOpt, ForceOpt, RandomInitOpt, SeedOpt, TrustOpt, WeightsOpt, handles_errors,
                                  quiet_third_party)


def register(app: typer.Typer) -> None:
    @app.command("export")
    @handles_errors
    @declares_a_model
    def export_cmd(
        model: Annotated[str, typer.Argument(help=MODEL_HELP)],
        input: Annotated[Optional[str], typer.Option("--input", "-i", rich_help_panel=PANEL_INPUT, help="Input NxCxHxW (default: the family's, 1x3x640x640).")] = None,
        imgsz: ImgszOpt = None,
        fp16: Annotated[bool, typer.Option("--fp16", rich_help_panel=PANEL_BUILD, help="Write the FP16 graph (ModelOpt AutoCast, FP32 I/O).")] = False,
        output: Annotated[Optional[Path], typer.Option("--output", "-o", rich_help_panel=PANEL_REPORTS, help="The ONNX file (default: ./MODEL[.fp16].onnx).")] = None,
        weights: WeightsOpt = None,
        trust_checkpoint: TrustOpt = False,
        random_init: RandomInitOpt = False,
        seed: SeedOpt = 0,
        nms: NmsOpt = False,
        opset: OpsetOpt = 18,
        simplifier: Annotated[str, typer.Option("--simplifier", rich_help_panel=PANEL_BUILD, help="onnxsim or onnxslim.")] = "onnxsim",
        images: ImagesOpt = None,
        rel_l2: Annotated[Optional[float], typer.Option("--rel-l2", rich_help_panel=PANEL_GATES, help="The final graph's rel L2 limit.")] = None,
        report: Annotated[Optional[Path], typer.Option("--report", rich_help_panel=PANEL_REPORTS, help="The parity report as JSON.")] = None,
        force: ForceOpt = False,
        recheck: RecheckOpt = False,
        declared: dict = None,
    ) -> None:
        """Export a model to a simplified ONNX graph and check it against PyTorch.

        Dynamic batch always, dynamic H/W where the family takes any size (YOLO, Depth-Anything-V2). A second identical export is a cache hit. Exit 1 if the graph strays beyond tolerance from PyTorch (nothing written). docs/export-build.md says more.

        Examples:

          enginekit export yolo12n --random-init

          enginekit export best.pt --fp16

          enginekit export yolov8n -w best.pt --nms --imgsz 320

          enginekit export depth --imgsz 518 -w depth_anything_v2_vits.pth

          enginekit export net.py:make --task semantic --size 256x256
        """
        from enginekit import api
        from enginekit.fsutil import atomic_write_text, check_output_path, json_text
        from enginekit.requests import ExportRequest

        check_output_path(report, "--report")
        request = ExportRequest(model=model, input=input, imgsz=imgsz, fp16=fp16, output=output, weights=weights,
                                random_init=random_init, seed=seed, opset=opset, simplifier=simplifier, images=images,
                                rel_l2=rel_l2, force=force, recheck=recheck, nms=nms, declared=declared)
        quiet_third_party()
        result = api.export(request)
        from enginekit.cli.render import parity_table
        from enginekit.cli.render import console, emit

        parity_table(result.parity)
        if result.fp16_share is not None:
            console.print(f"  FP16 share of initializer elements: {result.fp16_share:.1%}")
        if report is not None:
            atomic_write_text(report, json_text(result.to_json(), indent=2) + "\n")
        if not result.passed:
            from enginekit.errors import ParityError

            from enginekit.cli.common import failure_summary

            raise ParityError(f"parity gate failed: {failure_summary(result.failures())} (nothing written)")
        emit(str(result.output))
