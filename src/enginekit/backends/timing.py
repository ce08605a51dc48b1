"""How bench times a backend: one prepared inference (``Runner``) and the clocks that time it.

``time_cpu`` uses ``perf_counter``; ``time_cuda`` CUDA events with a synchronize after every run.
Each backend's ``timed`` returns a Runner that says what its time includes (host-device copies,
a CUDA graph) and which clock reads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

Tick = Callable[[int], None]

# host_device_copies values
COPIES_EXCLUDED = "excluded"
COPIES_INCLUDED = "included"
COPIES_NOT_APPLICABLE = "not applicable"

# --- timing ----------------------------------------------------------------------------


def time_cpu(run: Callable[[], Any], warmup: int, iters: int, tick: Tick) -> np.ndarray:
    """Warm-up, then ``iters`` runs timed with perf_counter; milliseconds per run."""
    for _ in range(warmup):
        run()
        tick(1)
    samples = np.empty(iters)
    for i in range(iters):
        start = time.perf_counter()
        run()
        samples[i] = (time.perf_counter() - start) * 1000.0
        tick(1)
    return samples


def time_cuda(run: Callable[[], Any], warmup: int, iters: int, tick: Tick, stream=None) -> np.ndarray:
    """Warm-up, then ``iters`` runs between CUDA events, synchronized after each run.

    Synchronizing each run measures one request's latency, not a pipelined rate; the events
    sit on the stream the work is queued on, so launch gaps count too.
    """
    import torch

    with torch.cuda.stream(stream):  # None: the current stream
        for _ in range(warmup):
            run()
            torch.cuda.current_stream().synchronize()
            tick(1)
        samples = np.empty(iters)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(iters):
            start.record()
            run()
            end.record()
            end.synchronize()
            samples[i] = start.elapsed_time(end)
            tick(1)
    return samples


@dataclass
class Runner:
    """One prepared inference at one batch size: ``run()`` does it once."""

    run: Callable[[], Any]
    device: str
    copies: str
    cuda_graph: bool = False
    detail: str = ""
    stream: Any = None  # a torch.cuda.Stream the work is queued on (None: the current one)
    close: Callable[[], None] = lambda: None
    timer: str = ""  # perf_counter | cuda-events; by default perf_counter on CPU, CUDA events on a GPU

    def __post_init__(self) -> None:
        if not self.timer:
            self.timer = "perf_counter" if self.device == "cpu" else "cuda-events"

    def time(self, warmup: int, iters: int, tick: Tick) -> np.ndarray:
        """Milliseconds per run of ``iters`` runs after ``warmup``, on this runner's clock."""
        if self.timer == "perf_counter":
            return time_cpu(self.run, warmup, iters, tick)
        return time_cuda(self.run, warmup, iters, tick, stream=self.stream)
