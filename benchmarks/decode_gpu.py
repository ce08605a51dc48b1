"""Device time of each part of the queued detection decode on a GPU, inside a CUDA graph as a step replays it.

    python benchmarks/decode_gpu.py [--weights best.pt ...] [--size 384] [--frame-hw 1080x1920]

For each model (default: yolo12n with random weights; the decode's time depends on its candidates, which are
reported): the network's outputs on bus.jpg brought to ``--frame-hw``, then ``queued_kernels.decode`` captured in
a CUDA graph with a timing event recorded before each of its four kernel launches and after the copy of its answer
to pinned host memory, replayed 300 times: the medians of the fill (the packed answer zeroed), ``best_class``,
``rank``, ``suppression``, ``keep`` and the copy, in microseconds; and the step graph's own stages (preprocessing,
network, decode) as a predictor's call of that frame replays them. Then ``keep`` alone with 2, 4, 8 and 16 warps
(its registers and spills, and whether its answer is the same). Needs a CUDA GPU with Triton.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PARTS = ("fill", "best_class", "rank", "suppression", "keep", "copy to host")


class _Timed:
    """A kernel whose launches record a timing event first (while a graph is captured)."""

    def __init__(self, kernel, events: list, warps: dict):
        self.kernel, self.events, self.warps = kernel, events, warps

    def __getitem__(self, grid):
        def launch(*args, **kw):
            import torch

            if torch.cuda.is_current_stream_capturing():
                self.events.append(torch.cuda.Event(enable_timing=True, external=True))
                self.events[-1].record()
            if self.kernel.__name__ == "keep" and self.warps.get("keep"):
                kw["num_warps"] = self.warps["keep"]
            compiled = self.kernel[grid](*args, **kw)
            self.warps[self.kernel.__name__ + " compiled"] = compiled
            return compiled

        return launch


def profile(predictor, frame, warps: dict, replays: int = 300):
    import torch

    from enginekit.backends.pytorch import capture_graph
    from enginekit.families.ultralytics import queued_kernels

    hw = predictor.processor.input_hw(frame.shape[:2])
    for _ in range(3):  # the step's graph captured (second call) and replayed
        predictor(frame)
    events: list = []
    real = queued_kernels._kernels
    kernels = [_Timed(k, events, warps) for k in real()]
    queued_kernels._kernels = lambda: kernels
    try:
        with torch.cuda.stream(predictor.stream or torch.cuda.current_stream()), torch.inference_mode():
            outputs = {k: v.clone() for k, v in predictor.session(predictor.device_input([frame], hw)).items()}
            spec = predictor.processor.queued_decode(outputs, [frame.shape[:2]], hw)
            host: list = []

            def decode():
                first = torch.cuda.Event(enable_timing=True, external=True)
                last = torch.cuda.Event(enable_timing=True, external=True)
                capturing = torch.cuda.is_current_stream_capturing()
                if capturing:
                    events.clear()
                    first.record()
                packed = spec.run(outputs)
                if capturing:
                    events.append(torch.cuda.Event(enable_timing=True, external=True))
                    events[-1].record()
                if not host:
                    host.extend(torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in packed)
                for h, p in zip(host, packed):
                    h.copy_(p, non_blocking=True)
                if capturing:
                    last.record()
                    events[:] = [first, *events, last]
                return packed

            graph, _ = capture_graph(decode, predictor.torch_device())
            marks = list(events)
            times = [[] for _ in range(len(marks) - 1)]
            for _ in range(replays):
                graph.replay()
                torch.cuda.synchronize()
                for i in range(len(marks) - 1):
                    times[i].append(marks[i].elapsed_time(marks[i + 1]) * 1e3)
    finally:
        queued_kernels._kernels = real
    flags = host[0].numpy()[:4]
    step = next((g for g in predictor._step_graphs.values() if g), None)
    stages = None
    if step is not None and len(step.events) > 3:
        e = step.events
        stages = tuple(round(e[i].elapsed_time(e[i + 1]) * 1e3, 1) for i in range(3))
    return [float(np.median(t)) for t in times], flags, stages, host[0].numpy().copy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", action="append", default=[], help="a detector checkpoint (repeatable)")
    ap.add_argument("--size", type=int, default=384)
    ap.add_argument("--frame-hw", default="1080x1920")
    args = ap.parse_args()
    import cv2
    import torch
    from ultralytics.utils import ASSETS

    import enginekit

    if not torch.cuda.is_available():
        raise SystemExit("decode_gpu.py needs a CUDA GPU")
    h, w = (int(v) for v in args.frame_hw.split("x"))
    frame = cv2.resize(cv2.imread(str(ASSETS / "bus.jpg")), (w, h))
    for target in args.weights or ["yolo12n"]:
        extra = {"random_init": True} if target == "yolo12n" else {}
        p = enginekit.load(target, precision="fp16", backend="torch", input_size=(args.size, args.size), **extra)
        warps: dict = {}
        parts, flags, stages, answer = profile(p, frame, warps)
        print(f"{target}: {int(flags[0])} candidates, {int(flags[1])} kept; us p50: "
              + ", ".join(f"{n} {v:.1f}" for n, v in zip(PARTS, parts)) + f"; total {sum(parts):.1f}")
        if stages is not None:
            print(f"  the step's graph: preprocessing {stages[0]}, network {stages[1]}, decode {stages[2]} us")
        for n in (2, 4, 8, 16):
            warps["keep"] = n
            parts_n, _, _, answer_n = profile(p, frame, warps, replays=200)
            compiled = warps.get("keep compiled")
            print(f"  keep on {n} warps: {parts_n[4]:.1f} us, registers {getattr(compiled, 'n_regs', '?')}, spills "
                  f"{getattr(compiled, 'n_spills', '?')}, same answer {np.array_equal(answer, answer_n)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
