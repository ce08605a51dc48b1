"""Outputs by meaning and their parity limits (families declare them; the comparison uses them)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """Parity limits of one precision (and one output part) against the FP32 PyTorch reference.

    Each field names a statistic of ``compare.metrics.STATISTICS`` (which says which way is
    worse); None: that statistic is not gated.
    """

    rel_l2: float | None
    cosine: float | None  # minimum cosine similarity
    max_abs: float | None = None  # largest absolute error (in the part's own units)

    def limits(self) -> dict[str, float]:
        """The gated statistics and their limits, in check order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def to_json(self) -> dict[str, float]:
        return self.limits()


@dataclass(frozen=True)
class OutputPart:
    """A part of a model output with one meaning, compared and gated on its own.

    YOLO's ``output0`` (B, 4+nc, A) holds box coordinates (0..640 px) and class probabilities
    (0..1) in one tensor: compared as one, the boxes drown the scores. A part is a slice of
    one output tensor along one axis.
    """

    name: str  # "boxes", "scores", "depth"
    output: str  # the output tensor it is cut from
    axis: int = -1
    start: int = 0
    stop: int | None = None  # None: to the end
    kind: str = "values"  # "boxes_xywh" | "boxes_xyxy" | "probabilities" | "classes" | "depth" | "values"

    def take(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        array = outputs[self.output]
        if self.start == 0 and self.stop is None:
            return array
        index = [slice(None)] * array.ndim
        index[self.axis] = slice(self.start, self.stop)
        return array[tuple(index)]

    def describe(self) -> str:
        if self.start == 0 and self.stop is None:
            return f"{self.output} ({self.kind})"
        stop = "" if self.stop is None else self.stop
        return f"{self.output}[axis {self.axis}: {self.start}:{stop}] ({self.kind})"
