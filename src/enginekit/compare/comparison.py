"""The one comparison: a candidate's outputs against the reference's, over a set of cases.

Export parity, build parity, repair trials and verify all call :func:`compare`; they differ only
in where the candidate runs and how the result is shown. Outputs are compared by meaning: each
family names the parts of its outputs (YOLO: ``boxes`` and ``scores`` of ``output0``), and every
part has its own statistics and limits, so a change of the class scores alone cannot hide
behind the box coordinates. Task metrics (detections, depth) are computed on the photographs.

Statistics are computed here rather than by Polygraphy's comparators: ``SimpleCompareFunc``
gives max/mean/median/quantile absolute and relative error, but its relative error divides by
the reference plus 2e-16, which explodes on class probabilities near 0, and cosine, L2 and PSNR
are separate functors that each log every output. The reference outputs are stored in
Polygraphy's ``RunResults`` format (``verification.references``) so a user can replay them with
``polygraphy run --load-outputs``; the absolute statistics agree with ``SimpleCompareFunc``'s
(tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import numpy as np

from enginekit.compare.metrics import output_stats
from enginekit.errors import UsageError
from enginekit.compare.parts import PARITY_LIMITS, OutputPart, Tolerance

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
PRECISIONS = ("fp32", "fp16", "int8", "fp8")


class Family(Protocol):
    """What the comparison needs of a model family (``families.base.ModelAdapter`` offers it)."""

    family: str
    task_gates: dict[str, dict[str, tuple[str, float]]]
    task_options: dict[str, float]

    def output_parts(self, metadata: dict[str, str] | None = None) -> tuple[OutputPart, ...]: ...
    def known_parts(self) -> tuple[str, ...]: ...
    def tolerance(self, precision: str) -> Tolerance: ...
    def part_tolerance(self, precision: str, part: str) -> Tolerance: ...
    def task_metrics(self, reference, candidate, metadata, options=None) -> dict[str, float]: ...
    def parity_outputs(self, reference, candidate, metadata) -> tuple[dict, dict]: ...
    def nothing_to_compare(self, task: dict[str, float]) -> str: ...


class Case(Protocol):
    """An input and the reference's outputs on it (``verification.references.ReferenceCase``)."""

    label: str
    kind: str  # "photo" | "random"
    feed: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


@dataclass
class SimpleCase:
    label: str
    kind: str
    feed: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


@dataclass
class Check:
    artifact: str
    name: str  # "parity scores rel_l2", "task recall"
    value: float
    op: str  # "<=" | ">="
    limit: float
    passed: bool

    def __str__(self) -> str:
        return f"{self.artifact}: {self.name} = {self.value:.4g} (limit {self.op} {self.limit:g})"


def _check(artifact: str, name: str, value: float, op: str, limit: float) -> Check:
    ok = bool(value >= limit) if op == ">=" else bool(value <= limit)  # NaN fails either way
    return Check(artifact, name, float(value), op, float(limit), ok)


@dataclass
class Gates:
    """Limits per precision and output part: the family's defaults, then the user's overrides.

    Override names: ``[precision.][part.]stat`` for parity (``rel_l2``, ``cosine``, ``max_abs``:
    ``scores.max_abs=0.01``, ``fp16.rel_l2=1e-3``), ``[precision.]metric`` for task gates
    (``map50=0.8``) and task options (``conf=0.1``).
    """

    adapter: Family
    overrides: dict[str, float] = field(default_factory=dict)
    #: a reference with nothing to compare on the photographs (a random-weight detector finds
    #: nothing at the operating point) fails the task gate; False: say so in the notes instead
    task_required: bool = True

    def __post_init__(self) -> None:
        parts = set(self.adapter.known_parts())
        metrics = {m for per in self.adapter.task_gates.values() for m in per}
        options = set(self.adapter.task_options)
        for key in self.overrides:
            tokens = key.split(".")
            if tokens[0] in PRECISIONS:
                tokens = tokens[1:]
            ok = (len(tokens) == 1 and tokens[0] in set(PARITY_LIMITS) | metrics | options) or (
                len(tokens) == 2 and tokens[0] in parts and tokens[1] in PARITY_LIMITS)
            if not ok:
                known = sorted(PARITY_LIMITS) + sorted(metrics) + sorted(options)
                raise UsageError(f"unknown tolerance {key!r} for {self.adapter.family}: use [precision.][part.]NAME "
                                 f"with NAME one of {', '.join(known)} and part one of {', '.join(sorted(parts))}")

    def _get(self, precision: str, name: str, default, part: str | None = None):
        for key in ((f"{precision}.{part}.{name}", f"{part}.{name}") if part else ()) + (f"{precision}.{name}", name):
            if key in self.overrides:
                return self.overrides[key]
        return default

    def parity(self, precision: str, part: str | None = None) -> Tolerance:
        tol = self.adapter.part_tolerance(precision, part) if part else self.adapter.tolerance(precision)
        return Tolerance(self._get(precision, "rel_l2", tol.rel_l2, part), self._get(precision, "cosine", tol.cosine, part),
                         self._get(precision, "max_abs", tol.max_abs, part))

    def task(self, precision: str) -> dict[str, tuple[str, float]]:
        gates = self.adapter.task_gates.get(precision, {})
        return {k: (op, self._get(precision, k, v)) for k, (op, v) in gates.items()}

    def options(self, precision: str) -> dict[str, float]:
        return {k: self._get(precision, k, v) for k, v in self.adapter.task_options.items()}


def parse_overrides(items: list[str]) -> dict[str, float]:
    """``["rel_l2=1e-3", "fp16.map50=0.8"]`` -> dict; bad items are one-line usage errors."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise UsageError(f"malformed --tol {item!r}: expected NAME=NUMBER, like rel_l2=1e-3, scores.max_abs=0.02 "
                             "or fp16.map50=0.9") from None
    return out


@dataclass
class Comparison:
    """What :func:`compare` found: per case and part statistics, the worst per part, task metrics, checks."""

    name: str
    precision: str
    parts: list[OutputPart]
    limits: dict[str, Tolerance]  # per part
    cases: list[dict] = field(default_factory=list)  # {"input", "kind", "outputs": [stats per part]}
    worst: dict[str, dict[str, float]] = field(default_factory=dict)  # per part
    task: dict[str, float] = field(default_factory=dict)
    task_gates: dict[str, tuple[str, float]] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def failures(self) -> list[str]:
        return [f"{c.name} = {c.value:.4g} (limit {c.op} {c.limit:g})" for c in self.checks if not c.passed]

    @property
    def worst_rel_l2(self) -> float:
        """The largest rel L2 over the parts (one number for a repair's history)."""
        return max((w["rel_l2"] for w in self.worst.values()), default=float("nan"))

    def parts_json(self) -> dict[str, dict]:
        return {p.name: {"of": p.describe(), "worst": self.worst.get(p.name, {}), "limits": self.limits[p.name].to_json()}
                for p in self.parts}


def _worst(acc: dict[str, float], s) -> None:
    for key in ("max_abs", "median_abs", "p99_abs", "max_rel", "median_rel", "p99_rel", "rel_l2"):
        acc[key] = max(acc.get(key, 0.0), getattr(s, key))
    for key in ("cosine", "psnr"):
        acc[key] = min(acc.get(key, float("inf")), getattr(s, key))
    acc["finite"] = min(acc.get("finite", 1.0), float(s.finite))


def compare(run: Runner, cases: Iterable[Case], *, adapter: Family, gates: Gates, precision: str,
            metadata: dict[str, str] | None = None, name: str = "candidate", require_task: bool = True) -> Comparison:
    """Run ``run`` on every case's feed; compare each output part with the reference's; gate.

    Parity: per part, the worst figures over the cases against the part's limits (finite, rel L2,
    cosine, and max abs where the family sets one). Task: the family's task metrics on the photo
    cases, against its task gates. ``require_task``: a candidate compared on no photograph, or on
    photographs where the reference offers nothing to compare (no detections at the operating
    point), fails; without it (export and build parity) that is a note.
    """
    metadata = metadata or {}
    parts = list(adapter.output_parts(metadata))
    result = Comparison(name, precision, parts, {p.name: gates.parity(precision, p.name) for p in parts})
    photo_ref: dict[str, list[np.ndarray]] = {}
    photo_got: dict[str, list[np.ndarray]] = {}
    for case in cases:
        got = run(case.feed)
        try:
            ref_rows, got_rows = adapter.parity_outputs(case.outputs, got, metadata)
        except KeyError as exc:
            raise ValueError(f"the candidate has no output {exc}") from None
        stats = []
        for part in parts:
            try:
                s = output_stats(part.name, part.take(ref_rows), part.take(got_rows))
            except KeyError as exc:
                raise ValueError(f"the candidate has no output {exc}") from None
            stats.append({"part": part.name, **s.to_json()})
            _worst(result.worst.setdefault(part.name, {}), s)
        result.cases.append({"input": case.label, "kind": case.kind, "outputs": stats})
        if case.kind == "photo":
            for out_name, ref in case.outputs.items():
                photo_ref.setdefault(out_name, []).append(ref)
                photo_got.setdefault(out_name, []).append(got[out_name])
    if not result.cases:
        result.checks.append(Check(name, "parity: inputs compared", 0.0, ">=", 1.0, False))
        return result
    for part in parts:
        w, tol = result.worst[part.name], result.limits[part.name]
        result.checks.append(_check(name, f"parity {part.name} finite", w["finite"], ">=", 1.0))
        result.checks.append(_check(name, f"parity {part.name} rel_l2", w["rel_l2"], "<=", tol.rel_l2))
        result.checks.append(_check(name, f"parity {part.name} cosine", w["cosine"], ">=", tol.cosine))
        if tol.max_abs is not None:
            result.checks.append(_check(name, f"parity {part.name} max_abs", w["max_abs"], "<=", tol.max_abs))
    _task_checks(result, adapter, gates, precision, metadata, photo_ref, photo_got, require_task)
    return result


def _task_checks(result: Comparison, adapter, gates, precision, metadata, photo_ref, photo_got, require_task) -> None:
    name = result.name
    if not photo_ref:
        if require_task:
            result.checks.append(Check(name, "task: photographs compared", 0.0, ">=", 1.0, False))
        else:
            result.notes.append("task metrics not computed: no photographs among the inputs")
        return
    ref_batch = {k: np.concatenate(v) for k, v in photo_ref.items()}
    got_batch = {k: np.concatenate(v) for k, v in photo_got.items()}
    result.task = adapter.task_metrics(ref_batch, got_batch, metadata, gates.options(precision))
    result.task_gates = gates.task(precision)
    if result.task.get("compared", 1.0) <= 0:
        what = adapter.nothing_to_compare(result.task)
        if require_task:
            result.checks.append(Check(name, f"task: nothing to compare ({what})", 0.0, ">=", 1.0, False))
        else:
            result.notes.append(f"task metrics not gated: nothing to compare ({what})")
        return
    for metric, (op, limit) in result.task_gates.items():
        result.checks.append(_check(name, f"task {metric}", result.task.get(metric, float("nan")), op, limit))
