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
        sources: Annotated[list[str], typer.Argument(help="An image, a folder of images, a video file, or a camera index (0); several: several cameras, one frame of each per step, batched.")],
        save: Annotated[Optional[Path], typer.Option("--save", help="Write overlays and results.json here (default: write nothing).")] = None,
        backend: Annotated[str, typer.Option("--backend", help=f"{', '.join(choices())}.")] = AUTO,
        precision: Annotated[str, typer.Option("--precision", help="fp32, fp16, int8 or fp8 (int8/fp8: tensorrt).")] = "fp32",
        weights: Annotated[Optional[list[Path]], typer.Option("--weights", "-w", help="Weights, once per model, in the order of MODELS.")] = None,
        random_init: RandomInitOpt = False,
        trust_checkpoint: TrustOpt = False,
        seed: SeedOpt = 0,
        conf: Annotated[float, typer.Option("--conf", help="Detection confidence threshold.")] = 0.25,
        iou: Annotated[float, typer.Option("--iou", help="NMS IoU threshold.")] = 0.7,
        max_frames: Annotated[Optional[int], typer.Option("--max-frames", help="Stop after this many frames (of each source).")] = None,
        device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda:N (default: the backend's).")] = None,
        gpu_letterbox: Annotated[bool, typer.Option("--gpu-letterbox", help="On a GPU, resize YOLO frames there (torch bilinear) instead of letterboxing them with OpenCV on the CPU as YOLO(pt).predict does: less CPU work per large frame, but pixels up to a grey level apart and scores about 1e-3 from the .pt's.")] = False,
        drop: Annotated[str, typer.Option("--drop", help="When frames come faster than the models take them: none (decoding waits; every frame is processed), oldest (the oldest waiting frame makes room: least latency, for live cameras), newest (the new frame is dropped).")] = "none",
        every: Annotated[Optional[list[str]], typer.Option("--every", help="A model's cadence, MODEL=N: it runs on every N-th step (depth=3); repeatable.")] = None,
        frames_per_step: Annotated[int, typer.Option("--frames-per-step", help="K consecutive frames of each source form one step, batched (stereo pairs: 2).")] = 1,
        batch: Annotated[Optional[int], typer.Option("--batch", help="Frames per inference call (default: the whole step).")] = None,
        queue: Annotated[int, typer.Option("--queue", help="Frames waiting per source between decoding and the models.")] = 2,
        in_flight: Annotated[int, typer.Option("--in-flight", help="Steps the models work on at once: 1 = least latency, 2 = stages overlap.")] = 2,
        pace: Annotated[Optional[float], typer.Option("--pace", help="Deliver a video's or folder's frames at this many per second, as a camera would (default: as fast as they decode).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print what each model found, per frame, as JSON on stdout (as results.json's frames), with the summary: frames/s, each stage's and the whole step's p50/p95/p99, drops (summary.stream).")] = False,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
    ) -> None:
        """Run one or several models on each frame and write what they see.

        Frames stream through the models: decoding runs in its own thread, each model's preprocessing, inference and postprocessing overlap (in threads on the CPU, on CUDA streams on a GPU), frames stay in order. Several models run on every frame, concurrently; --every gives one a cadence. Bad input (unreadable image, video that does not open, absent camera) is one error line, exit 2, and nothing is written.

        Examples:

          enginekit predict yolo12n bus.jpg --weights best.pt --save out/

          enginekit predict yolo12n,depth video.mp4 --random-init --every depth=3 --json

          enginekit predict yolo12n 0 1 --random-init --drop oldest     # two cameras, one batch per step
        """
        from enginekit.fsutil import check_output_path
        from enginekit.runtime.stream import StreamOptions, parse_every

        check_output_path(save, "--save", folder=True)  # before any work
        if max_frames is not None and max_frames < 1:
            from enginekit.errors import UsageError

            raise UsageError(f"--max-frames {max_frames}: expected a positive whole number")
        options = StreamOptions(drop=drop, queue=queue, every=parse_every(every), frames_per_step=frames_per_step,
                                batch=batch, in_flight=in_flight, pace=pace)
        quiet_third_party()
        from enginekit.flows.predict import run_predict

        summary = run_predict(models, sources, save=save, backend=backend, precision=precision,
                              weights=weights or [], random_init=random_init, seed=seed, conf=conf, iou=iou,
                              max_frames=max_frames, device=device, stream=options, gpu_letterbox=gpu_letterbox)
        _render(summary, save, as_json, sources)


def _render(summary: dict, save: Path | None, as_json: bool = False, sources: list[str] = ()) -> None:
    """The stream's figures on stderr; on stdout the folder written, if any, or with ``--json`` every
    frame's results, the summary (the stream's figures under ``stream``) and the folder (as ``save``)."""
    from enginekit.cli.render import console, emit

    console.print(stream_table(summary["stream"], title=f"{summary['frames']} frame(s), {summary['fps']} frames/s"))
    if as_json:
        from enginekit.fsutil import json_text

        frames = summary.get("records", [])
        stats = {k: v for k, v in summary.items() if k != "records"}
        source = list(sources) if len(sources) > 1 else (sources[0] if sources else "")
        emit(json_text({"source": source, "save": str(save) if save is not None else None, "summary": stats,
                        "frames": frames}, indent=2))
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
