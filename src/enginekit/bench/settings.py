"""bench settings: what ``--backend``, ``--batch`` and ``--input`` mean, checked before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enginekit.errors import UsageError
from enginekit.precisions import names as precision_names
from enginekit.shapes import Shape, parse_shape

#: every runner, in the order rows are reported
RUNNERS = (
    "torch-fp32",
    "torch-fp16",
    "torch-fp16-cudagraph",
    "onnxruntime-cpu",
    "onnxruntime-cuda",
    "tensorrt",
    "tensorrt-rtx",
)
#: what ``--backend`` accepts beyond runner names
FAMILIES = {
    "torch": ("torch-fp32", "torch-fp16", "torch-fp16-cudagraph"),
    "onnxruntime": ("onnxruntime-cpu", "onnxruntime-cuda"),
    "ort": ("onnxruntime-cpu", "onnxruntime-cuda"),
}
PRECISIONS = precision_names(exported=True)
def parse_backends(text: str) -> list[str]:
    """``"torch,onnxruntime-cpu"`` -> runner names in report order; UsageError for unknown names."""
    chosen: set[str] = set()
    for item in (part.strip().lower() for part in text.split(",")):
        if not item:
            continue
        if item in FAMILIES:
            chosen.update(FAMILIES[item])
        elif item in RUNNERS:
            chosen.add(item)
        else:
            known = ", ".join(list(FAMILIES) + list(RUNNERS))
            raise UsageError(f"unknown backend {item!r}: choose from {known}")
    if not chosen:
        raise UsageError("--backend names no backend: try torch,onnxruntime,tensorrt")
    return [name for name in RUNNERS if name in chosen]


def parse_batches(text: str) -> list[int]:
    """``"1,8,16"`` -> sorted, de-duplicated positive batch sizes."""
    try:
        values = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise UsageError(f"malformed --batch {text!r}: expected positive integers like 1,8,16") from None
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
    backends: tuple[str, ...] = ("torch-fp32", "onnxruntime-cpu")
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
        if self.warmup < 0:
            raise UsageError(f"--warmup must not be negative, not {self.warmup}")
        unknown = [b for b in self.backends if b not in RUNNERS]
        if unknown:
            raise UsageError(f"unknown backend {unknown[0]!r}: choose from {', '.join(RUNNERS)}")
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
