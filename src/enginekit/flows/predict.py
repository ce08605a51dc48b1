"""The work behind ``enginekit predict``: sources -> predictors -> overlays + results.json.

Everything is written to a temporary folder beside ``--save`` and moved into place at the
end, so a run that fails writes nothing.
"""

from __future__ import annotations

import dataclasses

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginekit import reporting
from enginekit.errors import UsageError
from enginekit.fsutil import json_text
from enginekit.requests import PredictRequest
from enginekit.families import resolve
from enginekit.flows.load import load
from enginekit.runtime.sources import draw, open_source
from enginekit.runtime.stream import Stream, StreamOptions


def _frame_sink(kind: str, tmp: Path, stem: str, model: str, fps: float, prefixed: bool = False):
    """Where one model's overlays go: an image per frame (``prefixed``: named after its source too), or one
    video."""
    import cv2

    state: dict = {}

    def write(index: int, name: str, image: np.ndarray) -> str:
        if kind in ("image", "folder"):
            # an image source is named by its stem (two of one name told apart there); a folder's frames by their
            # own names, after the folder's where several sources share the folder
            own = stem if kind == "image" else f"{stem + '-' if prefixed else ''}{Path(name).stem}"
            path = tmp / f"{own}_{model}.jpg"
            if not cv2.imwrite(str(path), image):  # OpenCV says False, not why: a full disk is the likely cause
                import errno

                full = shutil.disk_usage(tmp).free < 4 * image.nbytes
                raise OSError(errno.ENOSPC if full else errno.EIO, "No space left on device" if full else
                              "OpenCV could not write the overlay", str(path))
            return path.name
        if "writer" not in state:
            h, w = image.shape[:2]
            state["path"] = tmp / f"{stem}_{model}.mp4"
            state["writer"] = cv2.VideoWriter(str(state["path"]), cv2.VideoWriter_fourcc(*"mp4v"), fps or 30.0, (w, h))
        state["writer"].write(image)
        return state["path"].name

    def close() -> None:
        if "writer" in state:
            state["writer"].release()

    def repeat() -> None:
        """The last overlay once more (a model that did not run on this frame keeps its video's frame rate)."""
        if "writer" in state and "image" in state:
            state["writer"].write(state["image"])

    def remember(index: int, name: str, image: np.ndarray) -> str:
        state["image"] = image
        return write(index, name, image)

    return remember, close, repeat


@dataclass
class PredictOutcome:
    """What ``predict`` found: ``summary`` (frames, frames/s, per-model stage means, the stream's figures,
    ``records``: per frame what each model found; ``document``: results.json's), and the run's ``events``."""

    summary: dict
    events: list = field(default_factory=list)

    @property
    def records(self) -> list[dict]:
        return self.summary["records"]

    @property
    def document(self) -> dict:
        return self.summary["document"]


def run_predict(request: PredictRequest, cache=None) -> PredictOutcome:
    """Every frame of the request's sources (several: one frame of each per step) through its models, on the
    streaming pipeline (``enginekit.runtime.stream``), overlays and results.json into ``save``."""
    r = request
    summary = _predict(r.models, r.sources, save=r.save, backend=r.backend, precision=r.precision,
                       weights=list(r.weights), random_init=r.random_init, seed=r.seed, conf=r.conf, iou=r.iou,
                       max_frames=r.max_frames, device=r.device,
                       stream=StreamOptions(drop=r.drop, queue=r.queue, every=dict(r.every),
                                            frames_per_step=r.frames_per_step, batch=r.batch, in_flight=r.in_flight,
                                            pace=r.pace),
                       gpu_letterbox=r.gpu_letterbox, imgsz=r.imgsz, declared=dict(r.declared), cache=cache)
    return PredictOutcome(summary)


def _predict(models: str, source, *, save: Path | None, backend: str, precision: str, weights: list[Path],
             random_init: bool, seed: int, conf: float, iou: float, max_frames: int | None, device: str | None,
             stream=None, gpu_letterbox: bool = False, imgsz=None, declared: dict | None = None, cache=None):
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        raise UsageError("no model given")
    if len(set(names)) != len(names):
        raise UsageError(f"{models}: a model is named twice")
    if max_frames is not None and max_frames < 1:
        raise UsageError(f"--max-frames {max_frames}: give at least 1 (or leave it out for every frame)")
    if len(weights) > len(names):
        raise UsageError(f"{len(weights)} --weights for {len(names)} model(s): give one per model, in order")
    options = stream or StreamOptions()
    _check_every(options.every, names)
    if declared and len(names) > 1:
        raise UsageError(f"{', '.join(f'--{k}' for k in declared)} declare one model; {models} names {len(names)}: "
                         "predict a graph exported with the declaration instead")
    sources = [source] if isinstance(source, (str, Path)) else list(source)
    if not sources:
        raise UsageError("no source given")
    opened = [open_source(str(s), max_frames=max_frames) for s in sources]  # bad input fails here, before any model loads
    if options.batch is None and all(s.kind in ("image", "folder") for s in opened):
        # photographs run one per inference call, as Ultralytics' predictor runs them: each gets its own time
        options = dataclasses.replace(options, batch=1)
    predictors = []
    for i, name in enumerate(names):
        w = weights[i] if i < len(weights) else None
        p = load(name, precision=precision, backend=backend, weights=w, random_init=random_init and w is None,
                 seed=seed, device=device, conf=conf, iou=iou, gpu_letterbox=gpu_letterbox, imgsz=imgsz,
                 cache=cache, quiet=False, **(declared or {}))  # a first export or build shows its stages
        reporting.note(f"{p.model}: {p.backend} on {p.device}, {p.precision} ({p.reason})")
        predictors.append(p)
    stems = _stems(opened)
    tmp = None
    if save is not None:
        save = Path(save)
        save.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{save.name}.", dir=save.parent))
    try:
        sinks = {(i, p.model): _frame_sink(src.kind, tmp, stems[i], p.model, src.fps, len(opened) > 1)
                 for i, src in enumerate(opened) for p in predictors} if tmp else {}
        last: dict = {}  # (source, model) -> the last overlay drawn (a model its cadence skipped repeats it)
        records = []
        runner = Stream(predictors, opened, options, names=names)
        counts = [s.count for s in opened]
        total = None if any(c is None for c in counts) else min(counts) * len(counts)
        try:
            with reporting.progress("predict", total=total) as bar:
                for step in runner:
                    for k, frame in enumerate(step.frames):
                        entry = {"frame": len(records), "source": frame.name, "step": step.index,
                                 "wall_ms": round(step.latency_ms, 3), "results": {}}
                        for p in predictors:
                            result = step.results.get(p.model)
                            if result is not None:
                                result[k].source = frame.name
                                item = {"found": result[k].found(), **result[k].to_json()}
                                if tmp is not None:
                                    last[(frame.source, p.model)] = sinks[(frame.source, p.model)][0](
                                        frame.index, frame.name, draw(frame.image, result[k]))
                                    item["overlay"] = last[(frame.source, p.model)]
                                entry["results"][p.model] = item
                            elif tmp is not None and opened[frame.source].kind in ("video", "camera") \
                                    and (frame.source, p.model) in last:
                                sinks[(frame.source, p.model)][2]()  # the video keeps its frame rate
                        records.append(entry)
                    fps = _recent_fps(runner.records)
                    bar.advance(len(step.frames), detail=f"{fps:.1f} FPS" if fps else None)
        finally:
            for _, close, _ in sinks.values():
                close()
        stats = runner.stats()
        summary = _summary(predictors, records, stats)
        summary["photographs"] = all(s.kind in ("image", "folder") for s in opened)  # not a video or a camera
        # one document, one schema: results.json and predict --json (docs/runtime.md)
        summary["document"] = {"source": [str(s) for s in sources] if len(sources) > 1 else str(sources[0]),
                               "save": str(save) if save is not None else None,
                               "models": [p.describe() for p in predictors],
                               "summary": {k: v for k, v in summary.items() if k not in ("document", "photographs")},
                               "frames": records}
        summary["records"] = records  # per frame: what each model found
        if tmp is not None:
            (tmp / "results.json").write_text(json_text(summary["document"], indent=2))
            save.mkdir(parents=True, exist_ok=True)
            for f in tmp.iterdir():
                shutil.move(str(f), save / f.name)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:  # a full disk, a bad frame, Ctrl-C: nothing half-written is left beside --save
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _check_every(every, names: list[str]) -> None:
    """``--every`` names models given (as written, or their variant or family), before any model loads."""
    known = set(names)
    for name in names:
        if not name.endswith((".onnx", ".plan", ".engine", ".yaml", ".yml")):
            try:
                adapter = resolve(name)
            except UsageError:  # a cache key: what it is shows once it loads (the stream checks again)
                return
            known.update((adapter.variant, adapter.family))
        else:
            return
    for key, n in every.items():
        if key not in known:
            raise UsageError(f"--every {key}={n}: no such model here (models: {', '.join(names)})")


def _stems(opened) -> list[str]:
    """One file stem per source (a source's own name; two of one name get their position added)."""
    stems = [s.name for s in opened]
    return [f"{stem}-{i}" if stems.count(stem) > 1 else stem for i, stem in enumerate(stems)]


def _recent_fps(records, n: int = 30) -> float | None:
    recent = records[-n:]
    if len(recent) < 2:
        return None
    span = recent[-1].done - recent[0].done
    return sum(len(r.frames) for r in recent[1:]) / span if span > 0 else None


def _summary(predictors, records, stats) -> dict:
    """Frames, frames/s and the frame's p50 as before; per model the mean of each stage; ``stream``: every
    stage's and the whole step's p50/p95/p99 (``enginekit.runtime.stream.StreamStats``)."""
    frame = stats.frame_ms or {}
    out = {"frames": len(records), "fps": stats.fps if stats.fps is not None else _fps(records),
           "wall_ms_p50": frame.get("p50"), "models": {}, "stream": stats.to_json()}
    for p in predictors:
        stages = {k: [] for k in ("preprocess_ms", "infer_ms", "postprocess_ms")}
        for rec in records:
            item = rec["results"].get(p.model)
            if item is None:
                continue
            for k in stages:
                stages[k].append(item["timings"][k])
        out["models"][p.model] = {k: round(float(np.mean(v)), 3) if v else None for k, v in stages.items()}
    return out


def _fps(records) -> float:
    """Frames per second of a run too short for the stream's own figure: 1000 / mean step time."""
    walls = [r["wall_ms"] for r in records]
    return round(1000.0 / float(np.mean(walls)), 2) if walls and np.mean(walls) > 0 else 0.0
