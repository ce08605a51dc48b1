"""Run an engine plan through polygraphy's TensorRT runner (TensorRT or TensorRT-RTX).

Needs a GPU the engine was built for; callers ask ``builder.can_run_here`` first.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np

from enginekit.trt.backends import Backend


def _profile_for(shape: tuple[int, ...], profiles: list[dict], input_name: str) -> int:
    """Index of the first optimization profile whose min..max holds ``shape``."""
    for i, profile in enumerate(profiles):
        rng = profile[input_name]
        if all(lo <= s <= hi for s, lo, hi in zip(shape, rng["min"], rng["max"])):
            return i
    raise ValueError(f"no optimization profile holds input shape {shape}")


def engine_runner(plan: Path, backend: Backend, profiles: list[dict], input_name: str):
    """A context manager yielding ``run(feed) -> outputs`` over the engine."""
    if backend.name == "tensorrt-rtx":
        os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"  # read when polygraphy imports TensorRT
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    class _Run:
        def __enter__(self) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
            self.runner = TrtRunner(EngineFromBytes(BytesFromPath(str(plan))))
            self.runner.activate()
            self.profile = 0

            def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                index = _profile_for(tuple(feed[input_name].shape), profiles, input_name)
                if index != self.profile:
                    self.runner.set_profile(index)
                    self.profile = index
                return {k: np.asarray(v) for k, v in self.runner.infer(feed).items()}

            return run

        def __exit__(self, *exc) -> None:
            self.runner.deactivate()

    return _Run()
