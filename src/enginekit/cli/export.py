"""enginekit export: PyTorch -> simplified ONNX (FP32, optionally FP16), parity-checked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import (BgrOpt, ClassesOpt, DynamicOpt, MeanOpt, MODEL_HELP, OutputsOpt, ResizeOpt, SizeOpt, StdOpt, TaskOpt, declared_of, NmsOpt, ForceOpt, RandomInitOpt, SeedOpt, TrustOpt, WeightsOpt, handles_errors,
                                  quiet_third_party)


def register(app: typer.Typer) -> None:
    @app.command("export")
    @handles_errors
    def export_cmd(
        model: Annotated[str, typer.Argument(help=MODEL_HELP)],
        input: Annotated[Optional[str], typer.Option("--input", "-i", help="Example input NxCxHxW (default: the family's, e.g. 1x3x640x640).")] = None,
        fp16: Annotated[bool, typer.Option("--fp16", help="Also convert to FP16 (ModelOpt AutoCast, FP32 I/O) and write that graph.")] = False,
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Where to write the ONNX (default: ./<model>[.fp16].onnx).")] = None,
        weights: WeightsOpt = None,
        trust_checkpoint: TrustOpt = False,
        random_init: RandomInitOpt = False,
        seed: SeedOpt = 0,
        nms: NmsOpt = False,
        opset: Annotated[int, typer.Option("--opset", help="ONNX opset.")] = 18,
        simplifier: Annotated[str, typer.Option("--simplifier", help="onnxsim or onnxslim.")] = "onnxsim",
        images: Annotated[Optional[Path], typer.Option("--images", help="Folder of photographs for the parity check (default: embedded).")] = None,
        rel_l2: Annotated[Optional[float], typer.Option("--rel-l2", help="Override the rel L2 tolerance of the final graph.")] = None,
        report: Annotated[Optional[Path], typer.Option("--report", help="Write the parity report as JSON here.")] = None,
        force: ForceOpt = False,
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
        """Export a model to a simplified ONNX graph and check it against PyTorch.

        Dynamic batch always; dynamic H/W for Depth-Anything-V2 (sides multiples of 14).
        Exits 1 if ONNX Runtime's output strays beyond tolerance from the PyTorch model's.

        Examples:

          enginekit export yolo12n --random-init

          enginekit export yolo12n --fp16 --weights runs/best.pt

          enginekit export yolov8n --nms --weights runs/best.pt

          enginekit export depth --input 1x3x518x518 --weights depth_anything_v2_vits.pth

          enginekit export torchvision:deeplabv3_resnet50 --weights deeplab.safetensors

          enginekit export net.py:make --task semantic --outputs logits:logits --size 256x256 --dynamic hw
        """
        from enginekit import api
        from enginekit.fsutil import atomic_write_text, check_output_path, json_text
        from enginekit.requests import ExportRequest

        check_output_path(report, "--report")
        request = ExportRequest(model=model, input=input, fp16=fp16, output=output, weights=weights,
                                random_init=random_init, seed=seed, opset=opset, simplifier=simplifier, images=images,
                                rel_l2=rel_l2, force=force, nms=nms, declared=declared_of(locals()))
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
