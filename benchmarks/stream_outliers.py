"""What makes a stream's p99 jump, measured on a CPU: Python's garbage collector and first runs on a new shape.

    python benchmarks/stream_outliers.py [--frames 3000] [--json out.json]

gc     A stream of cheap steps whose caller keeps a JSON record per frame (as ``predict --save`` does), with
       torch, Ultralytics and ONNX Runtime loaded, the collector held (``gc.freeze``, the stream's default)
       or not: collections over 1 ms (or full ones), the longest, and the steps' p99 and longest.
full   How long one full collection takes with those libraries loaded, before and after ``gc.freeze``.
first  yolo12n (random weights, 160x160) on ONNX Runtime's CPU provider: the first runs on a new input
       shape against the steady state (what the stream's warm-up per shape keeps out of the figures).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


class _Result:
    def __init__(self, value):
        from enginekit.results import Timings

        self.value, self.timings, self.source = value, Timings(), None


class _Cheap:
    """A predictor whose network is a copy: the step's cost is the stream's own."""

    model, family = "cheap", "cheap"

    def __init__(self):
        from enginekit.backends.base import SessionInfo
        from enginekit.runtime.predictor import Predictor

        self.info = SessionInfo("cheap", "cpu", "x", ("y",), (None, 3, 8, 8), np.float32, None)
        self.processor = type("P", (), {"input_hw": lambda self, shape: (8, 8)})()
        self.chunks = Predictor.chunks.__get__(self)
        self.run_chunk = Predictor.run_chunk.__get__(self)

    def preprocess_cpu(self, frames, hw, rgb=False):
        return np.stack([f[:1, :1, 0] for f in frames])

    def infer_cpu(self, x):
        time.sleep(0.0005)
        return {"y": x.copy()}

    def postprocess(self, outputs, shapes, hw):
        return [_Result(int(v.ravel()[0])) for v in outputs["y"]]


def gc_run(frames: int, hold: bool) -> dict:
    from enginekit.runtime.stream import Stream, StreamOptions

    source = [(f"f{i}", np.full((8, 8, 3), i % 256, np.uint8)) for i in range(frames)]
    stream = Stream([_Cheap()], [source], StreamOptions(hold_gc=hold, warmup=0))
    records = []
    for step in stream:
        records.append({"frame": step.index, "detections": [
            {"box": [1.0, 2.0, 3.0, 4.0], "score": 0.5, "class_id": 1, "name": "bus"} for _ in range(30)]})
    stats = stream.stats()
    return {"held": hold, "collections": stats.gc["pauses"], "longest_collection_ms": stats.gc["max_ms"],
            "step_p99_ms": stats.frame_ms["p99"], "step_max_ms": stats.frame_ms["max"]}


def full_collection() -> dict:
    gc.collect()
    t = time.perf_counter()
    gc.collect()
    before = (time.perf_counter() - t) * 1e3
    gc.freeze()
    t = time.perf_counter()
    gc.collect()
    after = (time.perf_counter() - t) * 1e3
    gc.unfreeze()
    return {"objects": len(gc.get_objects()), "full_collection_ms": round(before, 2),
            "after_freeze_ms": round(after, 3)}


def first_runs() -> dict:
    import cv2

    from enginekit.flows.load import load
    from enginekit.images import embedded_image_paths

    predictor = load("yolo12n", backend="onnxruntime-cpu", random_init=True, input_size=160)
    frame = cv2.imread(str(embedded_image_paths()[0]))
    runs = []
    for _ in range(12):
        t = time.perf_counter()
        predictor(frame)
        runs.append((time.perf_counter() - t) * 1e3)
    return {"first_ms": round(runs[0], 1), "second_ms": round(runs[1], 1),
            "steady_p50_ms": round(float(np.median(runs[4:])), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=3000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import onnxruntime  # noqa: F401 - the heap a real run has
    import torch  # noqa: F401
    import ultralytics  # noqa: F401
    from ultralytics.utils import nms  # noqa: F401

    report = {"machine": {"cpu_count": os.cpu_count()}, "full": full_collection(),
              "gc": [gc_run(args.frames, False), gc_run(args.frames, True)], "first": first_runs()}
    f = report["full"]
    print(f"full collection with torch, Ultralytics, ONNX Runtime loaded ({f['objects']} objects): "
          f"{f['full_collection_ms']} ms; after gc.freeze: {f['after_freeze_ms']} ms")
    for r in report["gc"]:
        print(f"collector {'held' if r['held'] else 'free'}: {r['collections']} collections over 1 ms or full, "
              f"longest {r['longest_collection_ms']} ms; steps p99 {r['step_p99_ms']} ms, longest {r['step_max_ms']} ms")
    fr = report["first"]
    print(f"yolo12n 160x160 ONNX Runtime CPU: first run {fr['first_ms']} ms, second {fr['second_ms']} ms, "
          f"steady p50 {fr['steady_p50_ms']} ms")
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
