"""The parity gate: every artifact of an engine entry against the stored PyTorch reference.

Execution (ONNX Runtime, TensorRT) is kept apart from comparison (metrics, gates): a candidate
is just a function from a feed to outputs.
"""

from __future__ import annotations

import math

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from enginekit.compare.comparison import (  # noqa: F401 - Check, Gates: public here too
    Check,
    Family,
    Gates,
    Runner,
    compare,
)

from enginekit.onnx import runtime


@dataclass
class ArtifactReport:
    name: str
    kind: str  # "onnx" | "engine"
    precision: str
    ran: bool = True
    reason: str = ""
    checks: list[Check] = field(default_factory=list)
    cases: list[dict] = field(default_factory=list)
    task: dict[str, float] = field(default_factory=dict)
    parts: dict[str, dict] = field(default_factory=dict)  # per output part: what it is, worst figures, limits
    notes: list[str] = field(default_factory=list)
    pictures: list[str] = field(default_factory=list)
    #: verify --data: its figures against the labels, its drops against the FP32 PyTorch model's, the limits
    ground_truth: dict = field(default_factory=dict)
    size_bytes: int = 0  # the graph or engine file (verify --data's ladder)
    key: str = ""  # its cache entry's key (a graph's, the engine's): what the report and JUnit name it by

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def state(self) -> dict:
        """What it found, as JSON data (a stored verdict: ``from_state`` gives it back)."""
        from dataclasses import asdict

        data = asdict(self)
        data["checks"] = [asdict(c) for c in self.checks]
        return _floats_out(data)

    @classmethod
    def from_state(cls, state: dict) -> "ArtifactReport":
        data = _floats_in(dict(state))
        data["checks"] = [Check(**c) for c in data.get("checks", [])]
        return cls(**data)

    @property
    def checked(self) -> bool:
        """It ran, and every output part was compared with a reference that depends on its input."""
        return self.ran and not any("constant" in info for info in self.parts.values())

    @property
    def status(self) -> str:
        """"pass" only where everything it names could have failed."""
        if not self.passed:
            return "fail"
        return "pass" if self.checked else "not-checked"


@dataclass
class VerifyReport:
    subject: str
    engine_key: str | None
    precision: str
    references_key: str
    references_status: str
    artifacts: list[ArtifactReport] = field(default_factory=list)
    skipped_images: list[str] = field(default_factory=list)
    #: an engine the user allowed to go unchecked (verify --allow-unverifiable): listed, not in the verdict
    excused: bool = False
    #: verify --data: the labels (dataset, split, images, instances, network size, the headline metric)
    ground_truth: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(a.passed for a in self.artifacts) and any(a.ran for a in self.artifacts)

    @property
    def engine_ran(self) -> bool:
        return any(a.kind == "engine" and a.ran for a in self.artifacts)

    def failures(self) -> list[Check]:
        return [c for a in self.artifacts for c in a.checks if not c.passed]

    def to_json(self) -> dict:
        data = asdict(self)
        data["passed"] = self.passed
        data["failures"] = [str(c) for c in self.failures()]
        for a, raw in zip(self.artifacts, data["artifacts"]):
            raw["passed"] = a.passed
            raw["status"] = a.status
        return data


def check_candidate(name: str, kind: str, precision: str, run: Runner, refs, gates: Gates, adapter: Family,
                    metadata: dict[str, str], accepts_hw=None) -> ArtifactReport:
    """Run a candidate on every reference case (``refs.cases_for``: each photograph letterboxed as the
    candidate's runtime would, ``accepts_hw`` saying which input sizes it takes); compare by part, task
    metrics, gates."""
    cases = refs.cases_for(accepts_hw) if hasattr(refs, "cases_for") else refs.cases
    found = compare(run, cases, adapter=adapter, gates=gates, precision=precision, metadata=metadata, name=name,
                    require_task=gates.task_required)
    return ArtifactReport(name, kind, precision, checks=found.checks, cases=found.cases, task=found.task,
                          parts=found.parts_json(), notes=found.notes)


def onnx_runner(path: Path) -> Runner:
    sess = runtime.session(path)
    return lambda feed: runtime.run(sess, feed)


def unrunnable(name: str, kind: str, precision: str, reason: str) -> ArtifactReport:
    """A candidate that exists but cannot run here: nothing compared, so its gate fails."""
    report = ArtifactReport(name, kind, precision, ran=False, reason=reason)
    report.checks.append(Check.unmet(name, "does not run on ONNX Runtime"))
    return report


def skipped(name: str, kind: str, precision: str, reason: str) -> ArtifactReport:
    return ArtifactReport(name, kind, precision, ran=False, reason=reason)


_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _floats_out(value):
    """JSON has no NaN or infinity (a PSNR of identical outputs, a figure of nothing): kept as their names."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _floats_out(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_floats_out(v) for v in value]
    return value


def _floats_in(value):
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, dict):
        return {k: _floats_in(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats_in(v) for v in value]
    return value
