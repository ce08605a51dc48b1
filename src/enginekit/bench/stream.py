"""bench --stream: frames of a video through the runtime's streaming pipeline (``enginekit.runtime.stream``).

Per backend, on the artifacts its network-only rows timed (as ``--e2e`` does): each model alone, then,
with several models, all of them on every frame (their cadences applied). Each row: every stage's
and the whole step's p50/p95/p99, and frames per second. The source is a video file, a folder or a
camera (``--source``), by default a video written from the embedded photographs
(``enginekit.images.write_video``), so a real decoder reads every frame.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enginekit.backends.timing import Tick
from enginekit.bench.e2e import _load
from enginekit.bench.measure import BenchReport
from enginekit.bench.plan import BenchPlan
from enginekit.errors import UsageError, first_line
from enginekit.images import DEFAULT_VIDEO_HW
from enginekit.images import write_video
from enginekit.runtime.sources import open_source
from enginekit.runtime.stream import Stream



@dataclass
class StreamRow:
    """One model (or several) on one backend, streamed."""

    models: list[str]
    backend: str
    status: str  # ok | skipped | failed
    reason: str | None = None
    device: str | None = None
    precision: str | None = None
    fps: float | None = None
    frame_ms: dict | None = None
    stats: dict[str, Any] = field(default_factory=dict)  # StreamStats.to_json()

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def default_source(frames: int, folder: Path, hw: tuple[int, int] = DEFAULT_VIDEO_HW) -> Path:
    return write_video(Path(folder) / "stream.mp4", frames, hw)


def open_frames(source: Path | str, frames: int):
    """A fresh reader of ``source`` (at most ``frames`` frames): each row streams it from its start."""
    return open_source(str(source), max_frames=frames)


def total_runs(plans: list[BenchPlan]) -> int:
    """Rows a progress bar counts."""
    ran = [sum(1 for i in p.items if i.skip is None and i.failure is None) for p in plans]
    rows = sum(ran)
    if len(plans) > 1:
        rows += sum(1 for items in zip(*(p.items for p in plans)) if all(i.skip is None and i.failure is None
                                                                          for i in items))
    return rows


def _row(plans, items, source, frames: int, options) -> StreamRow:
    models = [p.adapter.variant for p in plans]
    name = items[0].name
    for item in items:
        if item.skip or item.failure:
            return StreamRow(models, name, "skipped", item.skip or item.failure)
    try:
        try:
            predictors = [_load(p, i) for p, i in zip(plans, items)]
        except UsageError as exc:
            predictors = [f"the runtime cannot load it: {exc}"]
        missing = next((p for p in predictors if isinstance(p, str)), None)
        if missing is not None:
            return StreamRow(models, name, "skipped", missing)
        stream = Stream(predictors, [open_frames(source, frames)], options, names=models)
        stats = stream.run()
        first = predictors[0]
        return StreamRow(models, name, "ok", device=first.device, precision=first.precision, fps=stats.fps,
                         frame_ms=stats.frame_ms, stats=stats.to_json())
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - one backend failing is a row, not a crash
        return StreamRow(models, name, "failed", first_line(exc, 200))


def measure_stream(plans: list[BenchPlan], reports: list[BenchReport], source: Path | None, options,
                   tick: Tick = lambda n: None) -> tuple[list[StreamRow], str]:
    """Stream rows: each model alone on each backend, then (several models) all of them together.
    Returns the rows and a description of the source."""
    s = plans[0].settings
    frames = (s.iters + 1) * options.frames_per_step
    with tempfile.TemporaryDirectory(prefix="enginekit-stream-") as tmp:
        if source is None:
            source = default_source(frames, Path(tmp))
            described = (f"a {DEFAULT_VIDEO_HW[1]}x{DEFAULT_VIDEO_HW[0]} MPEG-4 video of {frames} frames made from "
                         "the embedded photographs")
        else:
            described = str(source)
        rows = []
        for plan in plans:
            for item in plan.items:
                rows.append(_row([plan], [item], source, frames, _alone(options, plan)))
                tick(1)
        if len(plans) > 1:
            for index in range(len(plans[0].items)):
                rows.append(_row(plans, [p.items[index] for p in plans], source, frames, options))
                tick(1)
    return rows, described


def _alone(options, plan: BenchPlan):
    """``options`` for one model alone: its cadence dropped (a model alone runs on every step)."""
    from dataclasses import replace

    return replace(options, every={})


def stream_json(rows: list[StreamRow], described: str) -> dict[str, Any]:
    return {
        "source": described,
        "timing": {
            "frame_ms": "per step: from leaving the decode queue to its last model's results (perf_counter); "
                        "p50/p95/p99 over the steps after each model's warm-up on the stream's frame shape",
            "fps": "frames per second over those steps: frames / (last result - first dispatch)",
            "stats": "every stage per model (preprocess, infer, postprocess, latency), decode per frame, the "
                     "queue wait and the frame's age (read to results): enginekit.runtime.stream.StreamStats",
        },
        "results": [r.to_json() for r in rows],
    }
