"""Run an engine plan through polygraphy's TensorRT runner (TensorRT or TensorRT-RTX).

Needs a GPU the engine was built for; callers ask ``session.engine_runs_here`` first.
``engine_runner`` serves verification (numpy in, numpy out, any profile); ``repeat_runner``
serves the benchmark (one fixed input, run again and again, copies in or out of the timing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from enginekit.trt.flavours import Flavour
from enginekit.engine_file import plan_bytes
from enginekit.trt.binding import bind


def _profile_for(shape: tuple[int, ...], profiles: list[dict], input_name: str) -> int:
    """Index of the first optimization profile whose min..max holds ``shape``."""
    for i, profile in enumerate(profiles):
        rng = profile[input_name]
        if all(lo <= s <= hi for s, lo, hi in zip(shape, rng["min"], rng["max"])):
            return i
    raise ValueError(f"no optimization profile holds input shape {shape}")


@contextlib.contextmanager
def _activated(plan: Path, flavour: Flavour):
    """An active polygraphy ``TrtRunner`` over ``plan``, deactivated on leaving."""
    bind(flavour)  # POLYGRAPHY_USE_TENSORRT_RTX is read once, when polygraphy is first imported
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    runner = TrtRunner(EngineFromBytes(lambda: plan_bytes(plan)))  # after an Ultralytics header, if any
    runner.activate()
    try:
        yield runner
    finally:
        runner.deactivate()


def engine_runner(plan: Path, flavour: Flavour, profiles: list[dict], input_name: str):
    """A context manager yielding ``run(feed) -> outputs`` over the engine."""

    @contextlib.contextmanager
    def _run() -> Iterator[Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]]:
        with _activated(plan, flavour) as runner:
            current = [0]

            def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                index = _profile_for(tuple(feed[input_name].shape), profiles, input_name)
                if index != current[0]:
                    runner.set_profile(index)
                    current[0] = index
                return {k: np.asarray(v) for k, v in runner.infer(feed).items()}

            yield run

    return _run()


@contextlib.contextmanager
def repeat_runner(plan: Path, flavour: Flavour, feed: dict[str, np.ndarray], *,
                  include_copies: bool) -> Iterator[Callable[[], None]]:
    """Yield ``run()``: one synchronous inference of ``feed`` (the engine's first profile).

    ``include_copies``: every run copies the numpy inputs to the GPU and the outputs back.
    Otherwise the inputs are copied to the GPU once (as torch CUDA tensors) and the outputs
    stay there, so a run is the engine's work plus polygraphy's per-call bookkeeping.
    """
    with _activated(plan, flavour) as runner:
        if include_copies:
            def run() -> None:
                runner.infer(feed, check_inputs=False, copy_outputs_to_host=True)
        else:
            import torch

            on_device = {name: torch.from_numpy(np.ascontiguousarray(a)).cuda() for name, a in feed.items()}

            def run() -> None:
                runner.infer(on_device, check_inputs=False, copy_outputs_to_host=False)

        yield run
