"""The parity gate: every artifact of an engine entry against the stored PyTorch reference.

Execution (ONNX Runtime, TensorRT) is kept apart from comparison (metrics, gates): a candidate
is just a function from a feed to outputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from enginekit.families.base import ModelAdapter, Tolerance
from enginekit.compare.metrics import output_stats
from enginekit.verification.references import References

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
STAGE_PRECISION = {"export": "fp32", "simplify": "fp32", "fp16": "fp16", "int8": "int8", "fp8": "fp8", "input": None}


@dataclass
class Check:
    artifact: str
    name: str  # "parity depth rel_l2", "task map50"
    value: float
    op: str  # "<=" | ">="
    limit: float
    passed: bool

    def __str__(self) -> str:
        return f"{self.artifact}: {self.name} = {self.value:.4g} (limit {self.op} {self.limit:g})"


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
    pictures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


@dataclass
class VerifyReport:
    subject: str
    engine_key: str | None
    precision: str
    references_key: str
    references_status: str
    artifacts: list[ArtifactReport] = field(default_factory=list)
    skipped_images: list[str] = field(default_factory=list)

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
        return data


@dataclass
class Gates:
    """Tolerances per precision: the family's defaults, then the user's overrides."""

    adapter: ModelAdapter
    overrides: dict[str, float] = field(default_factory=dict)  # "rel_l2" or "fp16.rel_l2" -> value

    def _override(self, precision: str, name: str, default: float) -> float:
        return self.overrides.get(f"{precision}.{name}", self.overrides.get(name, default))

    def parity(self, precision: str) -> Tolerance:
        tol = self.adapter.tolerance(precision)
        return Tolerance(self._override(precision, "rel_l2", tol.rel_l2), self._override(precision, "cosine", tol.cosine))

    def task(self, precision: str) -> dict[str, tuple[str, float]]:
        gates = self.adapter.task_gates.get(precision, {})
        return {k: (op, self._override(precision, k, v)) for k, (op, v) in gates.items()}


def parse_overrides(items: list[str]) -> dict[str, float]:
    """``["rel_l2=1e-3", "fp16.map50=0.8"]`` -> dict; bad items are one-line usage errors."""
    from enginekit.errors import UsageError

    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise UsageError(f"malformed --tol {item!r}: expected NAME=NUMBER, like rel_l2=1e-3 or fp16.map50=0.9") from None
    return out


def check_candidate(name: str, kind: str, precision: str, run: Runner, refs: References, gates: Gates,
                    adapter: ModelAdapter, metadata: dict[str, str]) -> ArtifactReport:
    """Run a candidate on every reference input; compare outputs and task metrics."""
    report = ArtifactReport(name, kind, precision)
    worst: dict[str, dict[str, float]] = {}
    photo_ref: dict[str, list[np.ndarray]] = {}
    photo_got: dict[str, list[np.ndarray]] = {}
    for case in refs.cases:
        got = run(case.feed)
        stats = []
        for out_name, ref in case.outputs.items():
            s = output_stats(out_name, ref, got[out_name])
            stats.append(s.to_json())
            w = worst.setdefault(out_name, {"rel_l2": 0.0, "cosine": 1.0, "finite": 1.0})
            w["rel_l2"] = max(w["rel_l2"], s.rel_l2)
            w["cosine"] = min(w["cosine"], s.cosine)
            w["finite"] = min(w["finite"], float(s.finite))
            if case.kind == "photo":
                photo_ref.setdefault(out_name, []).append(ref)
                photo_got.setdefault(out_name, []).append(got[out_name])
        report.cases.append({"input": case.label, "outputs": stats})
    tol = gates.parity(precision)
    for out_name, w in worst.items():
        report.checks.append(Check(name, f"parity {out_name} finite", w["finite"], ">=", 1.0, w["finite"] >= 1.0))
        report.checks.append(Check(name, f"parity {out_name} rel_l2", w["rel_l2"], "<=", tol.rel_l2, w["rel_l2"] <= tol.rel_l2))
        report.checks.append(Check(name, f"parity {out_name} cosine", w["cosine"], ">=", tol.cosine, w["cosine"] >= tol.cosine))
    if photo_ref:
        ref_batch = {k: np.concatenate(v) for k, v in photo_ref.items()}
        got_batch = {k: np.concatenate(v) for k, v in photo_got.items()}
        report.task = adapter.task_metrics(ref_batch, got_batch, metadata)
        for metric, (op, limit) in gates.task(precision).items():
            value = report.task.get(metric, float("nan"))
            ok = bool(value >= limit) if op == ">=" else bool(value <= limit)
            report.checks.append(Check(name, f"task {metric}", value, op, limit, ok))
    else:
        report.checks.append(Check(name, "task: photographs compared", 0.0, ">=", 1.0, False))
    return report


def onnx_runner(path: Path) -> Runner:
    from enginekit.onnx import runtime

    sess = runtime.session(path)
    return lambda feed: runtime.run(sess, feed)


def unrunnable(name: str, kind: str, precision: str, reason: str) -> ArtifactReport:
    """A candidate that exists but cannot run here: nothing compared, so its gate fails."""
    report = ArtifactReport(name, kind, precision, ran=False, reason=reason)
    report.checks.append(Check(name, "runs on ONNX Runtime", 0.0, ">=", 1.0, False))
    return report


def skipped(name: str, kind: str, precision: str, reason: str) -> ArtifactReport:
    return ArtifactReport(name, kind, precision, ran=False, reason=reason)
