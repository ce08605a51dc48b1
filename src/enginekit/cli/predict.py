"""enginekit predict: run models on images, a folder, a video or a camera; overlays and JSON per frame."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.backends import AUTO, choices
from enginekit.cli.common import RandomInitOpt, RemoteOpt, RemoteReadOnlyOpt, SeedOpt, TrustOpt, handles_errors, quiet_third_party


def register(app: typer.Typer) -> None:
    @app.command("predict")
    @handles_errors
    def predict_cmd(
        models: Annotated[str, typer.Argument(help="Model name(s), comma-separated (yolo12n,depth), a cache key, an engine plan or an ONNX file.")],
        source: Annotated[str, typer.Argument(help="An image, a folder of images, a video file, or a camera index (0).")],
        save: Annotated[Optional[Path], typer.Option("--save", help="Write overlays and results.json here (default: write nothing).")] = None,
        backend: Annotated[str, typer.Option("--backend", help=f"{', '.join(choices())}.")] = AUTO,
        precision: Annotated[str, typer.Option("--precision", help="fp32, fp16, int8 or fp8 (int8/fp8: tensorrt).")] = "fp32",
        weights: Annotated[Optional[list[Path]], typer.Option("--weights", "-w", help="Weights, once per model, in the order of MODELS.")] = None,
        random_init: RandomInitOpt = False,
        trust_checkpoint: TrustOpt = False,
        seed: SeedOpt = 0,
        conf: Annotated[float, typer.Option("--conf", help="Detection confidence threshold.")] = 0.25,
        iou: Annotated[float, typer.Option("--iou", help="NMS IoU threshold.")] = 0.7,
        max_frames: Annotated[Optional[int], typer.Option("--max-frames", help="Stop after this many frames.")] = None,
        device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda:N (default: the backend's).")] = None,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
    ) -> None:
        """Run one or several models on each frame and write what they see.

        Several models (yolo12n,depth) run on every frame, concurrently on their own CUDA streams on a GPU.
        Bad input (unreadable image, video that does not open, absent camera) is one error line, exit 2,
        and nothing is written.

        Examples:

          enginekit predict yolo12n bus.jpg --weights best.pt --save out/

          enginekit predict yolo12n,depth video.mp4 --random-init --save out/ --backend onnxruntime-cuda
        """
        from enginekit.fsutil import check_output_path

        check_output_path(save, "--save", folder=True)  # before any work
        quiet_third_party()
        from enginekit.flows.predict import run_predict

        summary = run_predict(models, source, save=save, backend=backend, precision=precision,
                              weights=weights or [], random_init=random_init, seed=seed, conf=conf, iou=iou,
                              max_frames=max_frames, device=device)
        _render(summary, save)


def _render(summary: dict, save: Path | None) -> None:
    """Per-stage timings per model on stderr; the folder written, if any, on stdout."""
    from rich.table import Table

    from enginekit.cli.render import console, emit

    table = Table(title=f"{summary['frames']} frame(s), {summary['fps']} FPS (p50 {summary['wall_ms_p50']} ms/frame)")
    for col in ("model", "preprocess ms", "infer ms", "postprocess ms"):
        table.add_column(col)
    for model, t in summary["models"].items():
        table.add_row(model, *(f"{t[k]:.2f}" for k in ("preprocess_ms", "infer_ms", "postprocess_ms")))
    console.print(table)
    if save is not None:
        emit(str(save))
