"""The pair in a stream on a GPU, ways of giving a step to its models side by side in one process: yolo12n and
Depth-Anything-V2-small at 384, FP16, torch, one step in flight, a 1080p video.

    python benchmarks/pair_gpu.py [--frames 1000] [--rounds 2] [--first yolo|depth]

Each round runs every variant once (two streams each: the second's figures), so the variants meet the same host:
  launch, woken once      the stream as it is (``Stream.dispatch = "launch"``): the graphs that hold the step's frames
                          already launched first, then each model's work queued, then their threads woken; the
                          caller's thread woken once a step, when every model has answered
  launch, woken per answer  the caller's thread woken by each model's answer as well (the way before)
  each, woken per answer  each model's work queued and its thread woken in turn (``dispatch = "each"``), and the
                          caller woken per answer: the way before both changes

Per variant: the pair's p50 (ms, a step's dispatch to its last answer) and each model's latency p50; where each
model's calls start and how long they take on the host (ms after the step's dispatch, medians: ``_Worker.launch``,
``submit``, ``hand``, ``_gpu_finish``, ``_answer``); on the GPU (the step graphs' own timing events, read once both
models have answered) how long after the first model's graph the second's starts, and when it ends. The wrappers
cost a microsecond or two each: the figures are where the time goes and a before/after within one process, not the
stream's goals (``stream_gpu.py``). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_host import timed  # noqa: E402 - its wrappers (importing it: offline, the source tree on the path)

LOG: dict[tuple, list] = {}
GPU: list = []
WAKE_PER_ANSWER = [False]
VARIANTS = (("launch", False), ("launch", True), ("each", True))


def instrument() -> None:
    from enginekit.runtime import stream, stream_worker

    for name, tag in (("launch", "launch"), ("submit", "submit"), ("hand", "hand"), ("_gpu_finish", "finish"),
                      ("_answer", "answer")):
        timed(stream_worker._Worker, name, tag, LOG, key=lambda worker: worker.predictor.model)
    real = stream.Stream._answer

    def answer(self, step, model, results, times):
        real(self, step, model, results, times)
        if len(step.results) < len(self.predictors):
            if WAKE_PER_ANSWER[0]:
                self.done.put(step.index)  # the way before: the caller's thread woken by this answer too
            return
        graphs = [next((g for g in p._step_graphs.values() if g), None) for p in self.predictors]
        if all(graphs):  # the step is complete: both graphs' events are this step's (the next is not dispatched)
            first, second = graphs[0].events, graphs[1].events
            GPU.append((first[0].elapsed_time(second[0]), first[0].elapsed_time(first[2]),
                        first[0].elapsed_time(second[2])))

    stream.Stream._answer = answer


def ms(values) -> float:
    return float(np.median(values)) * 1e3


def run(predictors, video: Path, frames: int, dispatch: str, per_answer: bool) -> None:
    from enginekit.runtime.sources import open_source
    from enginekit.runtime.stream import Stream, StreamOptions

    WAKE_PER_ANSWER[0] = per_answer
    names = [p.model for p in predictors]
    for _ in range(2):  # the second stream's figures (the first warms up what a process warms once)
        LOG.clear()
        GPU.clear()
        s = Stream(predictors, [open_source(str(video), max_frames=frames)], StreamOptions(in_flight=1), names=names)
        s.dispatch = dispatch
        rows = [(st.dispatched, st.done, {m: st.times[m].latency for m in st.times}) for st in s]
    n = len(rows)
    dispatched = np.array([r[0] for r in rows])
    pair = np.median([(r[1] - r[0]) * 1e3 for r in rows])
    each = ", ".join(f"{m} {np.median([r[2][m] for r in rows]):.3f}" for m in names)
    print(f"{dispatch}, woken {'per answer' if per_answer else 'once'}: steps {n}, pair p50 {pair:.3f} ms ({each})")
    marks = [(key, np.array(v[-n:])) for key, v in LOG.items() if len(v) >= n]
    for (tag, model), a in sorted(marks, key=lambda kv: ms(kv[1][:, 0] - dispatched)):
        print(f"  {tag:>7} {model:<26} from {ms(a[:, 0] - dispatched):6.3f} for {ms(a[:, 1] - a[:, 0]):6.3f}")
    if GPU:
        g = np.array(GPU[-n:])
        print(f"  GPU: {names[1]}'s graph starts {np.median(g[:, 0]):.3f} after {names[0]}'s; {names[0]}'s network "
              f"ends at {np.median(g[:, 1]):.3f}, {names[1]}'s at {np.median(g[:, 2]):.3f} (ms after {names[0]}'s start)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2, help="runs of every variant, interleaved")
    ap.add_argument("--first", choices=("yolo", "depth"), default="yolo", help="the model given first to the stream")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("pair_gpu.py needs a CUDA GPU")
    instrument()
    import enginekit
    from enginekit.images import write_video

    with tempfile.TemporaryDirectory() as tmp:
        video = write_video(Path(tmp) / "stream.mp4", args.frames + 1, (1080, 1920))
        yolo, depth = (enginekit.load(m, precision="fp16", backend="torch", random_init=True, input_size=(384, 384))
                       for m in ("yolo12n", "depth"))
        predictors = [yolo, depth] if args.first == "yolo" else [depth, yolo]
        for r in range(args.rounds):
            print(f"round {r + 1}:")
            for dispatch, per_answer in VARIANTS:
                run(predictors, video, args.frames, dispatch, per_answer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
