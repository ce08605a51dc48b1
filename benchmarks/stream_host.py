"""Where a GPU step's time goes on the host, in a stream: yolo12n (or depth) alone, one step in flight, a 1080p video.

    python benchmarks/stream_host.py [--model yolo12n|depth] [--frames 1000] [--video-hw 1080x1920] [--step-graph off]
                                     [--bind off]

The stream's own calls are timed where they start and end (wrappers around ``_Worker.send``,
``Predictor.submit_gpu``, ``host_frames``, ``_uploads``, ``_step_graph`` and within it the step graph's copy and
replay, or its replay alone where the frame was copied into its input ahead (``bind_ahead``, timed too, after the
step before), ``_gpu_finish``, the decode's ``results``, ``_Worker._answer``), each as milliseconds after the
step's dispatch (medians over the steps of the second of two runs), with the step's latency and network p50 as the
stream reports them; and the decoding thread's time between two reads of the video (``cv2.VideoCapture.read`` timed),
whether it overlaps a step's dispatch or its last 0.4 ms, and the latency p50 of the steps it overlaps and of the
others. Then, alone on this thread with nothing else running, the host time of one copy into the step graph's input
and of its replay.
The wrappers cost a microsecond or two each: the figures are where the time goes, not the stream's goals
(``stream_gpu.py``). Needs a CUDA GPU and the torch backend.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

clock = time.perf_counter
LOG: dict[str, list] = {}
READS: list = []


def timed(cls, name: str, tag: str, log: dict | None = None, key=None) -> None:
    """``cls.name`` wrapped: each call's start and end in ``log`` (default ``LOG``) under ``tag``, or under
    ``(tag, key(self))``."""
    f = getattr(cls, name)
    log = LOG if log is None else log

    def call(self, *a, **k):
        t0 = clock()
        try:
            return f(self, *a, **k)
        finally:
            log.setdefault(tag if key is None else (tag, key(self)), []).append((t0, clock()))

    setattr(cls, name, call)


def instrument() -> None:
    import cv2

    from enginekit.families.ultralytics import runtime as yolo_runtime
    from enginekit.runtime import predictor, step_graph, stream_worker

    real = cv2.VideoCapture

    class Capture:  # the decoder's reads, timed
        def __init__(self, *a):
            self.cap = real(*a)

        def read(self, *a):
            t0 = clock()
            out = self.cap.read(*a)
            READS.append((t0, clock()))
            return out

        def __getattr__(self, k):
            return getattr(self.cap, k)

    cv2.VideoCapture = Capture
    for cls, name, tag in ((stream_worker._Worker, "send", "send"), (predictor.Predictor, "submit_gpu", "submit"),
                           (predictor.Predictor, "host_frames", "host_frames"),
                           (predictor.Predictor, "_uploads", "uploads"),
                           (predictor.Predictor, "_step_graph", "step graph"),
                           (predictor.Predictor, "bind_ahead", "bind ahead"),
                           (stream_worker._Worker, "_gpu_finish", "finish"),
                           (yolo_runtime.QueuedDecode, "results", "results"),
                           (stream_worker._Worker, "_answer", "answer")):
        timed(cls, name, tag)

    def replay(self, tensors):
        t0 = clock()
        for s, t in zip(self.static_in, tensors):
            s.copy_(t, non_blocking=True)
        t1 = clock()
        getattr(self.graph, "graph", self.graph).replay()  # the CUDA graph itself (not the wrapper below)
        LOG.setdefault("copy", []).append((t0, t1))
        LOG.setdefault("replay", []).append((t1, clock()))

    step_graph.StepGraph.replay = replay

    bound_replays = []

    class Graph:  # around a step graph's CUDA graph: its replays with no copy before them
        def __init__(self, graph):
            self.graph = graph

        def replay(self):
            t0 = clock()
            self.graph.replay()
            bound_replays.append((t0, clock()))

    real_capture = step_graph.capture_step

    def capture(*a, **k):
        entry = real_capture(*a, **k)
        if entry is not None:
            entry.graph = Graph(entry.graph)
        return entry

    predictor.capture_step = capture
    LOG["bound replay"] = bound_replays


def ms(values) -> float:
    return round(float(np.median(values)) * 1e3, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="yolo12n")
    ap.add_argument("--frames", type=int, default=1000)
    ap.add_argument("--video-hw", default="1080x1920")
    ap.add_argument("--size", type=int, default=384)
    ap.add_argument("--step-graph", choices=("on", "off"), default="on")
    ap.add_argument("--bind", choices=("on", "off"), default="on")
    args = ap.parse_args()
    instrument()
    import torch

    import enginekit
    from enginekit.images import write_video
    from enginekit.runtime.sources import open_source
    from enginekit.runtime.stream import Stream, StreamOptions

    if not torch.cuda.is_available():
        raise SystemExit("stream_host.py needs a CUDA GPU")
    h, w = (int(v) for v in args.video_hw.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        video = write_video(Path(tmp) / "stream.mp4", args.frames + 1, (h, w))
        p = enginekit.load(args.model, precision="fp16", backend="torch", random_init=True,
                           input_size=(args.size, args.size))
        if args.step_graph == "off":
            p.session.forward_in_graph = None
        for _ in range(2):  # the second run's figures (the first warms up what a process warms once)
            for v in LOG.values():
                v.clear()
            READS.clear()
            s = Stream([p], [open_source(str(video), max_frames=args.frames)], StreamOptions(in_flight=1),
                       names=[p.model])
            s.bind_ahead = args.bind == "on"
            rows = [(st.times[p.model].latency, st.results[p.model][0].timings.infer, st.dispatched)
                    for st in s]  # the steps not kept: a frame kept keeps its pinned buffer from the pool
    n = len(rows)
    latency, infer, dispatched = (np.array(c) for c in zip(*rows))
    out = {"model": p.model, "steps": n, "latency p50": round(float(np.median(latency)), 3),
           "network p50": round(float(np.median(infer)), 3),
           "ratio": round(float(np.median(latency) / np.median(infer)), 3)}
    starts = np.sort(dispatched)
    for tag in ("send", "submit", "host_frames", "uploads", "step graph", "copy", "replay", "bound replay",
                "bind ahead", "finish", "results", "answer"):
        marks = LOG.get(tag, [])
        if tag in ("copy", "replay", "bound replay", "bind ahead"):  # not every step has one: by its step's dispatch
            marks = [m for m in marks if m[0] >= starts[0]]
            if not marks:
                continue
            a = np.array(marks)
            since = a[:, 0] - starts[np.searchsorted(starts, a[:, 0], side="right") - 1]
            out[f"{tag}: steps, start, duration"] = (len(a), ms(since), ms(a[:, 1] - a[:, 0]))
            continue
        if len(marks) < n:
            continue
        a = np.array(marks[-n:])  # the timed steps' (the warm-up's calls come first)
        out[f"{tag}: start, duration"] = (ms(a[:, 0] - dispatched), ms(a[:, 1] - a[:, 0]))
    reads = np.array(READS)
    between = np.stack([reads[:-1, 1], reads[1:, 0]], 1)  # the decoding thread between two reads
    out["decoder: read, between reads"] = (ms(reads[:, 1] - reads[:, 0]), ms(between[:, 1] - between[:, 0]))
    send = np.array(LOG["send"][-n:])
    answer = np.array(LOG["answer"][-n:])
    for name, windows in (("dispatch", np.stack([dispatched, send[:, 1]], 1)),
                          ("last 0.4 ms", np.stack([answer[:, 0] - 4e-4, answer[:, 0]], 1))):
        hit = np.array([((between[:, 0] < b) & (between[:, 1] > a)).any() for a, b in windows])
        out[f"steps with the decoder between reads during their {name}"] = int(hit.sum())
        if hit.any() and (~hit).any():
            out[f"  their latency p50, the others' ({name})"] = (round(float(np.median(latency[hit])), 3),
                                                      round(float(np.median(latency[~hit])), 3))
    for k, v in out.items():
        print(f"{k}: {v}")
    entry = next((g for g in p._step_graphs.values() if g), None)
    if entry is not None:
        with torch.inference_mode():
            frame = entry.static_in[0].clone()
            copies, replays = [], []
            for _ in range(300):
                torch.cuda.synchronize()
                t0 = clock()
                entry.static_in[0].copy_(frame, non_blocking=True)
                t1 = clock()
                entry.graph.replay()
                copies.append(t1 - t0)
                replays.append(clock() - t1)
            torch.cuda.synchronize()
        print(f"alone on one thread: copy into the step graph's input {ms(copies)} ms, its replay {ms(replays)} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
