"""Parity of an ONNX artifact against the PyTorch reference, on ONNX Runtime (CPU).

Every candidate is compared with the FP32 PyTorch reference, never with another candidate:
ONNX Runtime's CPU FP16 kernels do not compute what a GPU does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginekit.images import ImageSet
from enginekit.families.base import LoadedModel, ModelAdapter, Tolerance
from enginekit.onnx import runtime
from enginekit.shapes import Shape, format_shape
from enginekit.compare.metrics import OutputStats, output_stats


@dataclass
class InputCase:
    label: str
    array: np.ndarray


@dataclass
class CaseResult:
    label: str
    outputs: list[OutputStats]


@dataclass
class ParityResult:
    artifact: str
    precision: str
    tolerance: Tolerance
    cases: list[CaseResult] = field(default_factory=list)

    def worst(self) -> dict[str, dict[str, float]]:
        """Per output: the worst rel L2 / max abs and lowest cosine over all cases."""
        agg: dict[str, dict[str, float]] = {}
        for case in self.cases:
            for s in case.outputs:
                a = agg.setdefault(s.name, {"rel_l2": 0.0, "max_abs": 0.0, "cosine": 1.0, "finite": 1.0})
                a["rel_l2"] = max(a["rel_l2"], s.rel_l2)
                a["max_abs"] = max(a["max_abs"], s.max_abs)
                a["cosine"] = min(a["cosine"], s.cosine)
                a["finite"] = min(a["finite"], float(s.finite))
        return agg

    def failures(self) -> list[str]:
        msgs = []
        for name, w in self.worst().items():
            if not w["finite"]:
                msgs.append(f"{name}: non-finite values")
            if w["rel_l2"] > self.tolerance.rel_l2:
                msgs.append(f"{name}: rel L2 {w['rel_l2']:.2e} > {self.tolerance.rel_l2:.0e}")
            if w["cosine"] < self.tolerance.cosine:
                msgs.append(f"{name}: cosine {w['cosine']:.6f} < {self.tolerance.cosine}")
        if not self.cases:
            msgs.append("no inputs were compared")
        return msgs

    @property
    def passed(self) -> bool:
        return not self.failures()

    def to_json(self) -> dict:
        return {
            "artifact": self.artifact,
            "precision": self.precision,
            "tolerance": self.tolerance.to_json(),
            "passed": self.passed,
            "failures": self.failures(),
            "worst": self.worst(),
            "cases": [{"input": c.label, "outputs": [s.to_json() for s in c.outputs]} for c in self.cases],
        }


def parity_inputs(adapter: ModelAdapter, shape: Shape, images: ImageSet | None, *, photos: int = 2,
                  seed: int = 0) -> list[InputCase]:
    """Real photographs preprocessed as the reference does, plus one random batch."""
    cases: list[InputCase] = []
    hw = (shape[2], shape[3])
    if images is not None:
        for img, path in list(zip(images.images, images.paths))[:photos]:
            cases.append(InputCase(f"photo {path.name} @{hw[0]}x{hw[1]}", adapter.preprocess(img, hw)))
    cases.append(InputCase(f"random {format_shape(shape)}", adapter.random_inputs(shape, seed)))
    return cases


class ReferenceCache:
    """PyTorch outputs per input case, computed once per process."""

    def __init__(self, adapter: ModelAdapter, loaded: LoadedModel):
        self.adapter, self.loaded = adapter, loaded
        self._outputs: dict[str, dict[str, np.ndarray]] = {}

    def get(self, case: InputCase) -> dict[str, np.ndarray]:
        if case.label not in self._outputs:
            self._outputs[case.label] = self.adapter.reference(self.loaded, case.array)
        return self._outputs[case.label]


def check_onnx(references: ReferenceCache, onnx_path: Path, cases: list[InputCase], precision: str,
               tolerance: Tolerance | None = None) -> ParityResult:
    adapter = references.adapter
    result = ParityResult(onnx_path.name, precision, tolerance or adapter.tolerance(precision))
    sess = runtime.session(onnx_path)
    input_name = sess.get_inputs()[0].name
    for case in cases:
        ref = references.get(case)
        got = runtime.run(sess, {input_name: case.array})
        result.cases.append(CaseResult(case.label, [output_stats(n, ref[n], got[n]) for n in ref]))
    return result
