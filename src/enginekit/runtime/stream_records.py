"""What a stream records: its frames, each step's results and times, and the figures over a run
(``StreamStats``: each stage's and the whole step's p50/p95/p99, frames per second). Nothing here runs a model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np



STAGES = ("preprocess", "infer", "postprocess")
PERCENTILES = (50, 95, 99)



@dataclass
class Frame:
    """One decoded frame: which source, its index there, its name, the image and when it was read."""

    source: int
    index: int
    name: str
    image: Any
    decode_ms: float
    read_at: float  # perf_counter when reading it started


@dataclass
class ModelTimes:
    """One model on one step: its stages (summed over the step's inference calls) and its latency."""

    preprocess: float = 0.0
    infer: float = 0.0
    postprocess: float = 0.0
    latency: float = 0.0  # from the step's dispatch to this model's results
    #: per frame of the step: its share of the inference call it ran in ([pre, infer, post] ms, the call's frames)
    frames: dict = field(default_factory=dict)

    def share(self, stage: int, idx, ms: float) -> None:
        """``ms`` of one inference call's ``stage`` (0 pre, 1 infer, 2 post) shared by its frames ``idx``."""
        for i in idx:
            self.frames.setdefault(i, [0.0, 0.0, 0.0, len(idx)])[stage] += ms / max(len(idx), 1)


@dataclass
class StepResult:
    """One step: its frames and, per model that ran on it, one result per frame (in the frames' order)."""

    index: int
    frames: list[Frame]
    results: dict[str, list] = field(default_factory=dict)
    times: dict[str, ModelTimes] = field(default_factory=dict)
    dispatched: float = 0.0  # perf_counter when the step left the decode queues
    done: float = 0.0  # perf_counter when its last model answered

    @property
    def latency_ms(self) -> float:
        return (self.done - self.dispatched) * 1e3

    @property
    def age_ms(self) -> float:
        """From the moment its first frame was read to its last result: what a camera user waits."""
        return (self.done - min(f.read_at for f in self.frames)) * 1e3



def _record(step: StepResult) -> StepResult:
    """What the figures keep of a step: its times, not its images or results."""
    frames = [Frame(f.source, f.index, f.name, None, f.decode_ms, f.read_at) for f in step.frames]
    return StepResult(step.index, frames, {}, dict(step.times), step.dispatched, step.done)


def percentiles(samples) -> dict[str, float] | None:
    """p50/p95/p99 and mean of ``samples`` (milliseconds), rounded; None when there are none."""
    values = np.asarray([s for s in samples if s is not None], dtype=np.float64)
    if values.size == 0:
        return None
    out = {f"p{q}": round(float(np.percentile(values, q)), 3) for q in PERCENTILES}
    out["mean"] = round(float(values.mean()), 3)
    out["max"] = round(float(values.max()), 3)
    return out


@dataclass
class StreamStats:
    """The figures of a stream. Each model warms up on each new input shape before the step that brings it
    is dispatched, with nothing else in flight, so every step is timed as it runs."""

    steps: int
    frames: int
    warmups: int  # (model, input shape) warm-ups run, untimed
    fps: float | None  # frames per second: frames / (last result - first dispatch)
    frame_ms: dict | None  # per step: dispatch (frames decoded, taken from the queues) -> last result
    age_ms: dict | None  # per step: first frame read -> last result (decoding and queue waits included)
    decode_ms: dict | None  # per frame
    wait_ms: dict | None  # per step: last frame decoded -> dispatch (time spent in the queue)
    models: dict[str, dict]  # per model: runs, stage percentiles, latency percentiles
    dropped: dict[str, int]  # frames dropped per source
    gc: dict
    options: dict

    @classmethod
    def of(cls, steps: list[StepResult], models: list[str], options, dropped, gc_pauses,
           warmups: int = 0):
        frames = sum(len(s.frames) for s in steps)
        ran = [s for s in steps if s.times]  # a step no model's cadence took has no latency
        fps = None
        if len(steps) >= 2:
            window = max(s.done for s in steps) - min(s.dispatched for s in steps)
            fps = round(frames / window, 2) if window > 0 else None
        per_model = {}
        for m in models:
            runs = [s.times[m] for s in steps if m in s.times]
            per_model[m] = {"runs": len(runs), **{f"{k}_ms": percentiles(getattr(t, k) for t in runs)
                                                  for k in (*STAGES, "latency")}}
        return cls(
            steps=len(steps), frames=frames, warmups=warmups, fps=fps,
            frame_ms=percentiles(s.latency_ms for s in ran), age_ms=percentiles(s.age_ms for s in ran),
            decode_ms=percentiles(f.decode_ms for s in steps for f in s.frames),
            wait_ms=percentiles((s.dispatched - max(f.read_at + f.decode_ms / 1e3 for f in s.frames)) * 1e3
                                for s in steps),
            models=per_model, dropped=dropped,
            gc={"held": options.hold_gc, "pauses": len(gc_pauses),
                "max_ms": round(max(gc_pauses), 3) if gc_pauses else 0.0,
                "total_ms": round(sum(gc_pauses), 3)},
            options={"drop": options.drop, "queue": options.queue, "every": dict(options.every),
                     "frames_per_step": options.frames_per_step, "batch": options.batch,
                     "in_flight": options.in_flight, "warmup": options.warmup, "pace": options.pace},
        )

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
