"""enginekit predict: run models on images, a folder, a video or a camera; overlays and JSON per frame."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.backends import AUTO, choices
from enginekit.cli.common import ModelsWeightsOpt, EveryOpt, FramesPerStepOpt, DropOpt, InFlightOpt, PANEL_BUILD, PANEL_GATES, PANEL_REPORTS, PANEL_STREAM, ImgszOpt, RandomInitOpt, RemoteOpt, RemoteReadOnlyOpt, SeedOpt, TrustOpt, declares_a_model, handles_errors, quiet_third_party


def register(app: typer.Typer) -> None:
    @app.command("predict")
    @handles_errors
    @declares_a_model
    def predict_cmd(
        models: Annotated[str, typer.Argument(help="Model(s), comma list (yolo12n,depth): names, best.pt, keys, ONNX or engine files.")],
        sources: Annotated[list[str], typer.Argument(help="Image, folder, video or camera index (0); several: one frame of each per step.")],
        weights: ModelsWeightsOpt = None,
        random_init: RandomInitOpt = False,
        trust_checkpoint: TrustOpt = False,
        seed: SeedOpt = 0,
        imgsz: ImgszOpt = None,
        backend: Annotated[str, typer.Option("--backend", rich_help_panel=PANEL_BUILD, help=f"{', '.join(choices())}.")] = AUTO,
        precision: Annotated[str, typer.Option("--precision", rich_help_panel=PANEL_BUILD, help="fp32, fp16, int8 or fp8 (int8/fp8: tensorrt).")] = "fp32",
        device: Annotated[Optional[str], typer.Option("--device", rich_help_panel=PANEL_BUILD, help="cpu or cuda:N (default: the backend's).")] = None,
        gpu_letterbox: Annotated[bool, typer.Option("--gpu-letterbox", rich_help_panel=PANEL_BUILD, help="Letterbox YOLO frames on the GPU (docs/runtime.md).")] = False,
        conf: Annotated[float, typer.Option("--conf", rich_help_panel=PANEL_GATES, help="Detection confidence threshold.")] = 0.25,
        iou: Annotated[float, typer.Option("--iou", rich_help_panel=PANEL_GATES, help="NMS IoU threshold.")] = 0.7,
        save: Annotated[Optional[Path], typer.Option("--save", rich_help_panel=PANEL_REPORTS, help="Folder for overlays and results.json.")] = None,
        as_json: Annotated[bool, typer.Option("--json", rich_help_panel=PANEL_REPORTS, help="results.json's document on stdout (docs/runtime.md).")] = False,
        verbose: Annotated[bool, typer.Option("--verbose", "-v", rich_help_panel=PANEL_REPORTS, help="Photographs too: each stage's p50/p95/p99.")] = False,
        max_frames: Annotated[Optional[int], typer.Option("--max-frames", rich_help_panel=PANEL_STREAM, help="Stop after this many frames of each source.")] = None,
        drop: DropOpt = "none",
        every: EveryOpt = None,
        frames_per_step: FramesPerStepOpt = 1,
        batch: Annotated[Optional[int], typer.Option("--batch", rich_help_panel=PANEL_STREAM, help="Frames per inference call (default: the step).")] = None,
        queue: Annotated[int, typer.Option("--queue", rich_help_panel=PANEL_STREAM, help="Frames waiting per source.")] = 2,
        in_flight: InFlightOpt = 2,
        pace: Annotated[Optional[float], typer.Option("--pace", rich_help_panel=PANEL_STREAM, help="Frames/s a file is read at, as a camera.")] = None,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
        declared: dict = None,
    ) -> None:
        """Run one or several models on each frame and say what they found.

        Per photograph: what each model found and how long it took, as Ultralytics' predictor says it. Videos and cameras stream: decoding, each model's stages and the models overlap, frames stay in order, and the stream's figures are shown. Bad input is one error line, exit 2, nothing written. docs/runtime.md says more.

        Examples:

          enginekit predict best.pt bus.jpg --save out/

          enginekit predict yolo12n,depth video.mp4 --random-init --every depth=3

          enginekit predict yolo12n 0 1 --random-init --drop oldest
        """
        from enginekit.fsutil import check_output_path
        from enginekit.runtime.stream import parse_every

        check_output_path(save, "--save", folder=True)  # before any work
        if max_frames is not None and max_frames < 1:
            from enginekit.errors import UsageError

            raise UsageError(f"--max-frames {max_frames}: expected a positive whole number")
        from enginekit.requests import PredictRequest

        request = PredictRequest(models=models, sources=sources, save=save, backend=backend, precision=precision,
                                 weights=weights or [], random_init=random_init, seed=seed, conf=conf, iou=iou,
                                 max_frames=max_frames, device=device, gpu_letterbox=gpu_letterbox, imgsz=imgsz,
                                 declared=declared, drop=drop, queue=queue, every=parse_every(every),
                                 frames_per_step=frames_per_step, batch=batch, in_flight=in_flight, pace=pace)
        quiet_third_party()
        from enginekit import api

        _render(api.predict(request).summary, save, as_json, verbose)


def _render(summary: dict, save: Path | None, as_json: bool = False, verbose: bool = False) -> None:
    """On stderr, per photograph what each model found and how long it took (as Ultralytics' predictor says it),
    and for a stream (or ``--verbose``) the stream's figures; on stdout the folder written, if any, or with
    ``--json`` results.json's document."""
    from rich.markup import escape

    from enginekit.cli.render import console, emit

    if summary.get("photographs"):
        for frame in summary.get("records", []):
            for model, item in frame["results"].items():
                ms = sum(item["timings"].get(k, 0.0) for k in ("preprocess_ms", "infer_ms", "postprocess_ms"))
                console.print(f"{escape(str(frame['source']))}: {escape(model)} {escape(item['found'])}, {ms:.1f}ms",
                              highlight=False)
    if verbose or not summary.get("photographs"):
        console.print(stream_table(summary["stream"], title=f"{summary['frames']} frame(s), {summary['fps']} frames/s"))
    if as_json:
        from enginekit.fsutil import json_text

        emit(json_text(summary["document"], indent=2))
    elif save is not None:
        emit(str(save))


def stream_table(stats: dict, title: str):
    """One row per model and stage, and the whole step: p50/p95/p99 ms (``StreamStats.to_json()``)."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("stage", "runs", "p50 ms", "p95 ms", "p99 ms", "mean ms"):
        table.add_column(col, justify="left" if col == "stage" else "right", no_wrap=True)

    def row(label, runs, figures):
        if figures:
            table.add_row(label, str(runs), *(f"{figures[k]:.2f}" for k in ("p50", "p95", "p99", "mean")))

    row("decode (per frame)", "", stats.get("decode_ms"))
    for model, m in stats["models"].items():
        for stage in ("preprocess", "infer", "postprocess", "latency"):
            row(f"{model} {stage}", m["runs"], m.get(f"{stage}_ms"))
    row("whole step", stats["steps"], stats.get("frame_ms"))
    row("frame age (read -> results)", "", stats.get("age_ms"))
    dropped = sum(stats["dropped"].values())
    table.caption = (f"{stats['warmups']} warm-up(s) on new input shapes, untimed; {dropped} frame(s) dropped "
                     f"(--drop {stats['options']['drop']}); garbage collector held: {stats['gc']['held']}, "
                     f"pauses: {stats['gc']['pauses']} (longest {stats['gc']['max_ms']:.1f} ms)")
    return table
