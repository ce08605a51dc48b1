"""Parity of an ONNX artifact against the PyTorch reference, on ONNX Runtime (CPU), for export,
build and repair: a caller of the one comparison (:func:`enginekit.compare.comparison.compare`).

Every candidate is compared with the FP32 PyTorch reference, never with another candidate:
ONNX Runtime's CPU FP16 kernels do not compute what a GPU does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from enginekit.compare.comparison import Case, Comparison, Family, Gates, compare
from enginekit.compare.parts import Tolerance
from enginekit.images import ImageSet
from enginekit.onnx import runtime
from enginekit.shapes import Shape, format_shape


@dataclass
class ParityResult:
    """Export/build parity of one graph: the comparison, shown per output part."""

    artifact: str
    precision: str
    tolerance: Tolerance  # the whole-output default; per-part limits are in ``comparison.limits``
    comparison: Comparison | None = None
    cases: list = field(default_factory=list)

    def worst(self) -> dict[str, dict[str, float]]:
        """Per output part: the worst figures over all cases."""
        return self.comparison.worst if self.comparison else {}

    def limits(self) -> dict[str, Tolerance]:
        return self.comparison.limits if self.comparison else {}

    def failures(self) -> list[str]:
        if self.comparison is None or not self.comparison.cases:
            return ["no inputs were compared"]
        return self.comparison.failures()

    @property
    def passed(self) -> bool:
        return not self.failures()

    @property
    def status(self) -> str:
        """"pass" only where every output part could have failed; "not-checked" where a part's reference
        is the same for every input (``Comparison.constant``)."""
        if not self.passed:
            return "fail"
        return "not-checked" if self.comparison is not None and self.comparison.constant else "pass"

    @property
    def task(self) -> dict[str, float]:
        return self.comparison.task if self.comparison else {}

    def state(self) -> dict:
        """The verdict as JSON data, to store (``from_state`` gives it back, the comparison whole)."""
        from dataclasses import asdict

        return {"artifact": self.artifact, "precision": self.precision, "tolerance": asdict(self.tolerance),
                "comparison": self.comparison.state() if self.comparison is not None else None}

    @classmethod
    def from_state(cls, state: dict) -> "ParityResult":
        comparison = Comparison.from_state(state["comparison"]) if state.get("comparison") else None
        result = cls(state["artifact"], state["precision"], Tolerance(**state["tolerance"]), comparison)
        result.cases = comparison.cases if comparison is not None else []
        return result

    def to_json(self) -> dict:
        c = self.comparison
        return {
            "artifact": self.artifact,
            "precision": self.precision,
            "tolerance": self.tolerance.to_json(),
            "passed": self.passed,
            "status": self.status,
            "failures": self.failures(),
            "parts": c.parts_json() if c else {},
            "worst": self.worst(),
            "task": self.task,
            "checks": [asdict(check) for check in c.checks] if c else [],
            "notes": c.notes if c else [],
            "cases": c.cases if c else [],
        }


def parity_inputs(adapter, shape: Shape, images: ImageSet | None, *, photos: int = 2, seed: int = 0,
                  rect: bool = True) -> list[Case]:
    """Real photographs preprocessed as the reference does, plus one random batch (the reference's
    outputs not computed yet: ``ReferenceCache.cases``). ``rect``: each photograph also at its own rectangle
    where the family letterboxes so (YOLO's .pt predict; its graphs take any H x W)."""
    cases: list[Case] = []
    hw = (shape[2], shape[3])
    name = adapter.input_name
    if images is not None:
        for img, path in list(zip(images.images, images.paths))[:photos]:
            cases.append(Case(f"photo {path.name} @{hw[0]}x{hw[1]}", "photo", {name: adapter.preprocess(img, hw)}))
            box = adapter.rect_hw(img.shape[:2], hw) if rect else None
            if box is not None and tuple(box) != hw:  # at its own rectangle too, as YOLO's .pt predict (any H/W graph)
                cases.append(Case(f"photo {path.name} @{box[0]}x{box[1]}", "photo",
                                  {name: adapter.preprocess_rect(img, hw)}, letterbox="rect"))
    cases.append(Case(f"random {format_shape(shape)}", "random", {name: adapter.random_inputs(shape, seed)}))
    return cases


class ReferenceCache:
    """PyTorch outputs per input case, computed once per process. ``loaded``: the model, or a function that loads
    it (on first use: a stored verdict needs no model)."""

    def __init__(self, adapter, loaded):
        self.adapter, self._loaded = adapter, loaded
        self._outputs: dict[str, dict[str, np.ndarray]] = {}

    @property
    def loaded(self):
        if callable(self._loaded) and not hasattr(self._loaded, "module"):
            self._loaded = self._loaded()
        return self._loaded

    def get(self, case: Case) -> dict[str, np.ndarray]:
        if case.label not in self._outputs:
            self._outputs[case.label] = self.adapter.reference(self.loaded, case.feed[self.adapter.input_name])
        return self._outputs[case.label]

    def cases(self, inputs: list[Case]) -> list[Case]:
        """``inputs`` with the reference's outputs."""
        return [replace(c, outputs=self.get(c)) for c in inputs]


class _Fixed(Gates):
    """Gates whose parity limit is one given tolerance for every part (``--rel-l2``, repair's)."""

    def __init__(self, adapter: Family, tolerance: Tolerance):
        super().__init__(adapter)
        self.fixed = tolerance

    def parity(self, precision: str, part: str | None = None) -> Tolerance:
        base = super().parity(precision, part)
        return Tolerance(self.fixed.rel_l2, self.fixed.cosine, self.fixed.max_abs if self.fixed.max_abs is not None
                         else base.max_abs)


def check_onnx(references: ReferenceCache, onnx_path: Path, cases: list[Case], precision: str,
               tolerance: Tolerance | None = None, *, gates: Gates | None = None,
               metadata: dict[str, str] | None = None, intervals: bool = True) -> ParityResult:
    """An ONNX graph on ONNX Runtime against the PyTorch reference, per output part.

    ``gates``: the family's limits with the user's overrides (default: the family's).
    ``tolerance``: one rel L2 / cosine limit for every part instead (kept for callers that set one).
    Task metrics are gated where the photographs give the reference something to compare.
    """
    adapter = references.adapter
    if gates is None:
        # the family's whole-output default stands for its per-part defaults
        fixed = tolerance is not None and tolerance != adapter.tolerance(precision)
        gates = _Fixed(adapter, tolerance) if fixed else Gates(adapter)
    sess = runtime.session(onnx_path)
    input_name = sess.get_inputs()[0].name
    if metadata is None:
        metadata = runtime_metadata(sess)

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return runtime.run(sess, {input_name: next(iter(feed.values()))})

    found = compare(run, references.cases(cases), adapter=adapter, gates=gates, precision=precision,
                    metadata=metadata, name=onnx_path.name, require_task=False, intervals=intervals)
    result = ParityResult(onnx_path.name, precision, tolerance or gates.parity(precision), found)
    result.cases = found.cases
    return result


def runtime_metadata(sess) -> dict[str, str]:
    """The ONNX metadata (enginekit writes family, model, end2end...) of a session's model."""
    try:
        return dict(sess.get_modelmeta().custom_metadata_map)
    except Exception:  # noqa: BLE001 - a session without metadata
        return {}
