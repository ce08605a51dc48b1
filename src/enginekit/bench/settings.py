"""bench settings: what ``--backend``, ``--batch`` and ``--input`` mean, checked before any work."""

from __future__ import annotations

import os

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enginekit.errors import UsageError
from enginekit.precisions import names as precision_names
from enginekit.shapes import Shape, parse_shape
from enginekit.backends.registry import BENCH_DEFAULT, parse_backends, runner_names  # noqa: F401 (bench's names)

PRECISIONS = precision_names(exported=True)


def parse_batches(text: str) -> list[int]:
    """``"1,8,16"`` -> sorted, de-duplicated positive batch sizes."""
    try:
        values = {int(part) for part in text.split(",") if part.strip()}
    except ValueError as cause:
        raise UsageError(f"malformed --batch {text!r}: expected positive integers like 1,8,16") from cause
    if not values or min(values) <= 0:
        raise UsageError(f"malformed --batch {text!r}: expected positive integers like 1,8,16")
    return sorted(values)


def parse_image_shape(text: str) -> tuple[Shape, int | None]:
    """``HxW``, ``CxHxW`` or ``NxCxHxW`` -> ((C, H, W), N or None). C defaults to 3."""
    dims = parse_shape(text, what="--input")
    if len(dims) == 2:
        return (3, *dims), None
    if len(dims) == 3:
        return dims, None
    if len(dims) == 4:
        return dims[1:], dims[0]
    raise UsageError(f"malformed --input {text!r}: expected HxW, CxHxW or NxCxHxW")


@dataclass(frozen=True)
class BenchSettings:
    """Everything that decides what is measured."""

    model: str
    batches: tuple[int, ...] = (1,)
    image_shape: Shape | None = None  # (C, H, W); None: the family's default
    precision: str = "fp32"  # of the ONNX graph and engines; torch rows carry their own
    backends: tuple[str, ...] = ()  # runner names; empty: bench's default (enginekit.backends.registry.BENCH_DEFAULT)
    warmup: int = 10
    iters: int = 50
    include_copies: bool = False  # GPU rows: time host->device input and device->host output copies
    threads: int | None = None  # CPU rows: intra-op threads of torch and ONNX Runtime (None: their default)
    weights: Path | None = None
    random_init: bool = False
    seed: int = 0
    opset: int = 18

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise UsageError(f"unknown precision {self.precision!r}: choose {', '.join(PRECISIONS)}")
        if self.iters < 2:
            raise UsageError(f"--iters must be at least 2, not {self.iters}")
        if self.threads is not None and self.threads <= 0:
            raise UsageError(f"--threads must be positive, not {self.threads}")
        cpus = os.cpu_count() or 1
        if self.threads is not None and self.threads > cpus:  # each is an OS thread: 100000 would never start
            raise UsageError(f"--threads {self.threads}: this machine has {cpus} CPUs; intra-op threads beyond "
                             "them only wait for each other (give at most that)")
        if self.warmup < 0:
            raise UsageError(f"--warmup must not be negative, not {self.warmup}")
        if not self.backends:
            object.__setattr__(self, "backends", tuple(parse_backends(BENCH_DEFAULT)))
        runners = runner_names()
        unknown = [b for b in self.backends if b not in runners]
        if unknown:
            raise UsageError(f"unknown backend {unknown[0]!r}: choose from {', '.join(runners)}")
        if not self.batches or min(self.batches) <= 0:
            raise UsageError("--batch needs positive batch sizes")

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "batches": list(self.batches),
            "precision": self.precision,
            "backends": list(self.backends),
            "warmup": self.warmup,
            "iters": self.iters,
            "include_copies": self.include_copies,
            "threads": self.threads,
            "seed": self.seed,
            "opset": self.opset,
        }
