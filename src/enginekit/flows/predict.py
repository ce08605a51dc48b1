"""The work behind ``enginekit predict``: sources -> predictors -> overlays + results.json.

Everything is written to a temporary folder beside ``--save`` and moved into place at the
end, so a run that fails writes nothing.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from enginekit import reporting
from enginekit.errors import UsageError


def _frame_sink(kind: str, tmp: Path, stem: str, model: str, fps: float):
    """Where one model's overlays go: an image per frame, or one video."""
    import cv2

    state: dict = {}

    def write(index: int, name: str, image: np.ndarray) -> str:
        if kind in ("image", "folder"):
            path = tmp / f"{Path(name).stem}_{model}.jpg"
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

    return write, close


def run_predict(models: str, source: str, *, save: Path | None, backend: str, precision: str, weights: list[Path],
                random_init: bool, seed: int, conf: float, iou: float, max_frames: int | None, device: str | None):
    from enginekit.flows.load import load
    from enginekit.runtime.predictor import Pipeline
    from enginekit.runtime.sources import draw, open_source

    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        raise UsageError("no model given")
    if len(weights) > len(names):
        raise UsageError(f"{len(weights)} --weights for {len(names)} model(s): give one per model, in order")
    frames = open_source(source, max_frames=max_frames)  # bad input fails here, before any model loads
    predictors = []
    for i, name in enumerate(names):
        w = weights[i] if i < len(weights) else None
        p = load(name, precision=precision, backend=backend, weights=w, random_init=random_init and w is None,
                 seed=seed, device=device, conf=conf, iou=iou)
        reporting.note(f"{p.model}: {p.backend} on {p.device}, {p.precision} ({p.reason})")
        predictors.append(p)
    pipeline = Pipeline(predictors)
    tmp = None
    if save is not None:
        save = Path(save)
        save.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{save.name}.", dir=save.parent))
    try:
        sinks = {p.model: _frame_sink(frames.kind, tmp, frames.name, p.model, frames.fps) for p in predictors} if tmp else {}
        records = []
        walls = []
        try:
            with reporting.progress("predict", total=frames.count) as bar:
                for index, (name, frame) in enumerate(frames):
                    t0 = time.perf_counter()
                    results = pipeline(frame)
                    walls.append((time.perf_counter() - t0) * 1e3)
                    entry = {"frame": index, "source": name, "wall_ms": round(walls[-1], 3), "results": {}}
                    for p, r in zip(predictors, results):
                        r.source = name
                        item = r.to_json()
                        if tmp is not None:
                            item["overlay"] = sinks[p.model][0](index, name, draw(frame, r))
                        entry["results"][p.model] = item
                    records.append(entry)
                    bar.advance(1, detail=f"{1000.0 / np.mean(walls[-30:]):.1f} FPS")
        finally:
            pipeline.close()
            for _, close in sinks.values():
                close()
        summary = _summary(predictors, records, walls)
        if tmp is not None:
            (tmp / "results.json").write_text(json.dumps({"source": source, "models": [p.describe() for p in predictors],
                                                          "summary": summary, "frames": records}, indent=2))
            save.mkdir(parents=True, exist_ok=True)
            for f in tmp.iterdir():
                shutil.move(str(f), save / f.name)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:  # a full disk, a bad frame, Ctrl-C: nothing half-written is left beside --save
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _summary(predictors, records, walls) -> dict:
    out = {"frames": len(records), "fps": round(1000.0 / float(np.mean(walls)), 2) if walls else 0.0,
           "wall_ms_p50": round(float(np.percentile(walls, 50)), 3) if walls else None, "models": {}}
    for p in predictors:
        stages = {k: [] for k in ("preprocess_ms", "infer_ms", "postprocess_ms")}
        for rec in records:
            t = rec["results"][p.model]["timings"]
            for k in stages:
                stages[k].append(t[k])
        out["models"][p.model] = {k: round(float(np.mean(v)), 3) if v else None for k, v in stages.items()}
    return out
