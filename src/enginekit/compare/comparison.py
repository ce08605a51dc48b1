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

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Protocol

import numpy as np

from enginekit.compare.metrics import STATISTICS, output_stats, passes
from enginekit.compare.parts import OutputPart, Tolerance
from enginekit.compare.intervals import (CONFIDENCE, UNDECIDED, Interval, decide, images_to_decide, rate_interval,
                                        rate_trials_to_decide)
from enginekit.compare.tolerances import Tolerances
from enginekit.compare.metrics import GROUND_TRUTH_PART
from enginekit.precisions import PRECISIONS

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

#: A reference output part that changes by less than this (rel L2) from one input to another does not
#: depend on its input, and a parity check on it cannot fail: whatever the candidate's weights, it gives
#: the same figures. Measured on a random-weight yolo12n (as Ultralytics builds it) at 640 px: its boxes
#: (the anchor grid) differ by rel L2 7e-9 between bus.jpg and zidane.jpg and its scores are equal bit for
#: bit; a graph with 10% of its largest weight tensor multiplied by -3 gave the untouched graph's figures.
VARIES = 1e-6


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


@dataclass
class Case:
    """One input and the reference's outputs on it. ``kind``: "photo" (a real photograph: task
    metrics are computed on it) or "random". ``outputs`` is None until the reference has run."""

    label: str
    kind: str
    feed: dict[str, np.ndarray]
    outputs: Optional[dict[str, np.ndarray]] = None
    #: a photograph letterboxed to its own rectangle ("rect", as YOLO's .pt predict: a candidate that takes
    #: that shape is checked on it instead of on the "" full-size one of the same photograph)
    letterbox: str = ""


@dataclass
class Check:
    artifact: str
    name: str  # "parity scores rel_l2", "task recall"
    value: float
    op: str  # "<=" | ">="
    limit: float
    passed: bool
    #: a condition, not a figure against a limit ("nothing to compare", "runs on ONNX Runtime"): said as it is
    condition: bool = False
    #: what the check is, stable from run to run (a JUnit test case's name): "" for the name's words before any
    #: figure or detail
    key: str = ""
    #: the figure's 95% interval ([low, high]: ``compare.intervals``), where it is a sample over images
    interval: list | None = None

    @property
    def case_name(self) -> str:
        """The check's name without what changes from run to run (figures, files, counts): "task: nothing to
        compare (...)" is "task: nothing to compare"."""
        if self.key:
            return self.key
        if not self.condition:
            return self.name
        import re

        return re.split(r"\s*[(;]|:\s+(?=\S*\d)", self.name, maxsplit=1)[0].strip() or self.name

    def __str__(self) -> str:
        if self.condition:
            return f"{self.artifact}: {self.name}"
        return f"{self.artifact}: {self.name} = {self.value:.4g}{self.interval_text} (limit {self.op} {self.limit:g})"

    @property
    def interval_text(self) -> str:
        """" [95%: 0.01, 0.05]" where the figure has an interval, else ""."""
        if not self.interval:
            return ""
        low, high = self.interval
        return f" [95%: {low:.4g}, {high:.4g}]"

    @classmethod
    def unmet(cls, artifact: str, what: str, key: str = "") -> "Check":
        """A failed condition: ``what`` did not hold (no figure, no limit); ``key``: its stable name."""
        return cls(artifact, what, 0.0, ">=", 1.0, False, condition=True, key=key)


def _check(artifact: str, name: str, value: float, op: str, limit: float) -> Check:
    return Check(artifact, name, float(value), op, float(limit), passes(op, value, limit))


#: task gates that are shares of detections (a rate of flips): their verdicts need enough detections
RATE_GATES = ("recall", "precision")


def binomial_minimum(limit: float) -> int:
    """The fewest detections on which a share gate at ``limit`` (recall >= 0.95) can be judged.

    The rule lets a share p = 1 - limit go (the 5% rule: p = 0.05). A graph that loses detections at
    exactly that rate loses, of n, a binomial count with mean n p and standard deviation
    sqrt(n p (1 - p)). A count can only tell that graph from a perfect one when its noise reaches one
    detection, the count's own step: n p (1 - p) >= 1, so n >= 1 / (p (1 - p)): 22 for the 5% rule
    (1 / 0.0475 = 21.05). Below it, one flip (1/n, 11% of 9 detections) decides the verdict either way.
    A limit of 0 or 1 has no rate to judge: no minimum."""
    p = 1.0 - float(limit)
    if not 0.0 < p < 1.0:
        return 0
    return int(math.ceil(1.0 / (p * (1.0 - p)) - 1e-9))


@dataclass
class Gates:
    """Limits per precision and output part: the family's defaults, then the user's tolerances
    (``compare.tolerances``: ``[precision.][part.]stat`` for parity, ``[precision.]metric`` for task
    gates and task options)."""

    adapter: Family
    tolerances: Tolerances = field(default_factory=Tolerances)
    #: a reference with nothing to compare on the photographs (a random-weight detector finds
    #: nothing at the operating point) fails the task gate; False: say so in the notes instead
    task_required: bool = True
    #: labels decide the task verdict (``verify --data``): the gates against the reference's own predictions (the
    #: detection-share rules and their evidence minimum) are not applied, the labels' drop limits are
    #: (``ground_truth``); the task metrics are still measured and shown
    labelled: bool = False

    def __post_init__(self) -> None:
        self.tolerances = Tolerances.coerce(self.tolerances)
        metrics = {m for per in self.adapter.task_gates.values() for m in per}
        if metrics & set(RATE_GATES):  # share gates rest on a number of detections, which a user may set
            metrics.add("min_detections")
        self.tolerances.check(self.adapter.family, self.adapter.known_parts(), metrics, self.adapter.task_options)

    def parity(self, precision: str, part: str | None = None) -> Tolerance:
        tol = self.adapter.part_tolerance(precision, part) if part else self.adapter.tolerance(precision)
        get = self.tolerances.get
        return Tolerance(get(precision, "rel_l2", tol.rel_l2, part), get(precision, "cosine", tol.cosine, part),
                         get(precision, "max_abs", tol.max_abs, part))

    def task(self, precision: str) -> dict[str, tuple[str, float]]:
        """Task metric -> (op, limit); the direction is the statistics table's where it knows the metric. None
        where labels decide the task verdict (``labelled``)."""
        if self.labelled:
            return {}
        gates = self.adapter.task_gates.get(precision, {})
        return {k: (STATISTICS[k].op if k in STATISTICS else op, self.tolerances.get(precision, k, v))
                for k, (op, v) in gates.items()}

    def options(self, precision: str) -> dict[str, float]:
        return {k: self.tolerances.get(precision, k, v) for k, v in self.adapter.task_options.items()}

    def state(self, precision: str, metadata: dict[str, str] | None = None) -> dict:
        """Every limit these gates hold for ``precision`` (a stored verdict's key: other limits, another verdict)."""
        state = {"parity": {p.name: self.parity(precision, p.name).to_json() for p in self.adapter.output_parts(metadata)},
                 "task": {k: list(v) for k, v in self.task(precision).items()}, "options": self.options(precision),
                 "task_required": self.task_required, "min_detections": self.sample_minimum(precision)}
        if self.labelled:  # absent otherwise: the keys of the verdicts stored before
            state["labelled"] = True
        return state

    def sample_minimum(self, precision: str) -> int:
        """The fewest reference detections a task verdict of ``precision`` rests on, where the user asks for a
        minimum (``--tol [precision.]min_detections=N``: point figures on at least N; 0: no minimum) instead of
        the default, shares decided on their 95% intervals (``rate_check``), which needs no minimum: 0 then."""
        given = self.tolerances.get(precision, "min_detections", None)
        if given is not None:
            return int(math.ceil(given))
        return 0

    def fewest_to_pass(self, precision: str) -> int:
        """The fewest detections on which a share gate of ``precision`` can pass at all: a perfect share's exact
        95% interval clears the strictest limit (72 for recall >= 0.95: 0.025 ** (1 / 72) = 0.950); the minimum the
        user set instead where there is one; 0 where shares are not decided on intervals."""
        if self.tolerances.get(precision, "min_detections", None) is not None:
            return self.sample_minimum(precision)
        limits = [limit for metric, (_, limit) in self.task(precision).items() if metric in RATE_GATES]
        if not limits or precision not in PRECISIONS or not PRECISIONS[precision].reduced or not 0 < max(limits) < 1:
            return 0
        tail = (1.0 - CONFIDENCE) / 2
        return int(math.ceil(math.log(tail) / math.log(max(limits)) - 1e-9))

    def ground_truth(self, precision: str) -> dict[str, float]:
        """Limits on a candidate's loss against labels (``verify --data``): the family's defaults (on its headline
        metric, ``label_gates``), then the user's ``gt.NAME`` limits, the more specific winning."""
        defaults = dict(getattr(self.adapter, "label_gates", {}).get(precision, {}))
        names = list(defaults) + [lim.name for lim in self.tolerances if lim.part == GROUND_TRUTH_PART
                                  and lim.name not in defaults]
        limits = {n: self.tolerances.get(precision, n, defaults.get(n), part=GROUND_TRUTH_PART) for n in names}
        return {n: float(v) for n, v in limits.items() if v is not None}


@dataclass
class GraphOutputs:
    """Two graphs of one model compared output by output, with no family to name parts or task
    metrics (simplify proves its graph computes what the original does): every output whole,
    against one tolerance. ``align``: the family's ``parity_outputs``, where there is one."""

    names: tuple[str, ...]
    limit: Tolerance
    align: Optional[Callable] = None
    family: str = "graph"
    task_gates: dict = field(default_factory=dict)
    task_options: dict = field(default_factory=dict)

    def output_parts(self, metadata: dict[str, str] | None = None) -> tuple[OutputPart, ...]:
        return tuple(OutputPart(name, name) for name in self.names)

    def known_parts(self) -> tuple[str, ...]:
        return self.names

    def tolerance(self, precision: str) -> Tolerance:
        return self.limit

    def part_tolerance(self, precision: str, part: str) -> Tolerance:
        return self.limit

    def parity_outputs(self, reference, candidate, metadata):
        return self.align(reference, candidate, metadata) if self.align else (reference, candidate)

    def task_metrics(self, reference, candidate, metadata, options=None) -> dict[str, float]:
        return {}

    def nothing_to_compare(self, task: dict[str, float]) -> str:
        return "no task metrics"


@dataclass
class Comparison:
    """What :func:`compare` found: per case and part statistics, the worst per part, task metrics, checks."""

    name: str
    precision: str
    parts: list[OutputPart]
    limits: dict[str, Tolerance]  # per part
    cases: list[dict] = field(default_factory=list)  # {"input", "kind", "outputs": [stats per part]}
    worst: dict[str, dict[str, float]] = field(default_factory=dict)  # per part, over the gated cases
    #: per part, over the random cases of a calibrated precision (gated for finite outputs only)
    structure: dict[str, dict[str, float]] = field(default_factory=dict)
    task: dict[str, float] = field(default_factory=dict)
    task_gates: dict[str, tuple[str, float]] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: parts whose reference output is the same for every input (:data:`VARIES`), with that variation:
    #: their parity is not gated (it could not fail), a failed check or a note says so
    constant: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (bool(self.checks) or bool(self.constant)) and all(c.passed for c in self.checks)

    @property
    def checked(self) -> bool:
        """Every output part was compared with a reference that depends on its input."""
        return not self.constant

    @property
    def status(self) -> str:
        """The word a step shows: "pass" only where everything it names could have failed."""
        if not self.passed:
            return "fail"
        return "pass" if self.checked else "not-checked"

    def failures(self) -> list[str]:
        return [c.name if c.condition else f"{c.name} = {c.value:.4g} (limit {c.op} {c.limit:g})"
                for c in self.checks if not c.passed]

    def state(self) -> dict:
        """Everything it found, as JSON data (a stored verdict: ``from_state`` gives it back)."""
        from dataclasses import asdict

        return {"name": self.name, "precision": self.precision, "parts": [asdict(p) for p in self.parts],
                "limits": {k: asdict(t) for k, t in self.limits.items()}, "cases": self.cases, "worst": self.worst,
                "structure": self.structure, "task": self.task,
                "task_gates": {k: list(v) for k, v in self.task_gates.items()},
                "checks": [asdict(c) for c in self.checks], "notes": self.notes, "constant": self.constant}

    @classmethod
    def from_state(cls, state: dict) -> "Comparison":
        return cls(state["name"], state["precision"], [OutputPart(**p) for p in state["parts"]],
                   {k: Tolerance(**t) for k, t in state["limits"].items()}, list(state["cases"]),
                   dict(state["worst"]), dict(state["structure"]), dict(state["task"]),
                   {k: tuple(v) for k, v in state["task_gates"].items()}, [Check(**c) for c in state["checks"]],
                   list(state["notes"]), dict(state["constant"]))

    @property
    def worst_rel_l2(self) -> float:
        """The largest rel L2 over the parts (one number for a repair's history)."""
        return max((w["rel_l2"] for w in self.worst.values()), default=float("nan"))

    def parts_json(self) -> dict[str, dict]:
        """Per part: what it is, its worst figures, its limits, and ``constant`` (its reference's rel L2
        between inputs) where it was not gated because its reference does not depend on the input."""
        return {p.name: {"of": p.describe(), "worst": self.worst.get(p.name, {}), "limits": self.limits[p.name].to_json(),
                         **({"constant": self.constant[p.name]} if p.name in self.constant else {})}
                for p in self.parts}


def of_part(check_name: str, part: str) -> bool:
    """Whether a check (by name) gates the output part ``part``: "parity boxes rel_l2", "parity boxes: ..."."""
    return check_name.startswith((f"parity {part} ", f"parity {part}:"))


def _worst(acc: dict[str, float], stats) -> None:
    """Fold one case's statistics into the worst so far, each the way the statistics table says is worse."""
    for key, value in stats.to_json().items():
        if key != "name":
            acc[key] = float(value) if key not in acc else STATISTICS[key].worse(acc[key], float(value))


def in_distribution_only(precision: str) -> bool:
    """Whether a precision's parity is judged on in-distribution inputs (photographs) only.

    A calibrated graph (INT8, FP8) holds the activation ranges of its calibration images; on random
    noise it is out of range and its relative figures say nothing of the model (the composites yolov8s,
    every node quantized: scores rel L2 0.12 on 24 held-out photographs, 0.27 on one noise input,
    benchmarks/int8_detectors.md). Random inputs still gate its structure: finite outputs of the
    right shapes at each profile's sizes."""
    return precision in PRECISIONS and PRECISIONS[precision].calibrated


def compare(run: Runner, cases: Iterable[Case], *, adapter: Family, gates: Gates, precision: str,
            metadata: dict[str, str] | None = None, name: str = "candidate", require_task: bool = True,
            intervals: bool = True) -> Comparison:
    """Run ``run`` on every case's feed; compare each output part with the reference's; gate.

    Parity: per part, the worst figures over the cases against the part's limits (finite, rel L2,
    cosine, and max abs where the family sets one); for a calibrated precision (INT8, FP8) over the
    photographs only, random cases gating only that outputs are finite (``in_distribution_only``).
    Task: the family's task metrics on the photo cases, against its task gates. ``require_task``: a
    candidate compared on no photograph, or on photographs where the reference offers nothing to
    compare (no detections at the operating point), fails; without it (export and build parity)
    that is a note. ``intervals``: a reduced precision's task gates decided on their bootstrap intervals (off only
    where the figures rank candidates and decide nothing, as repair's per-node measurement).
    """
    metadata = metadata or {}
    parts = list(adapter.output_parts(metadata))
    result = Comparison(name, precision, parts, {p.name: gates.parity(precision, p.name) for p in parts})
    photos_only = in_distribution_only(precision)
    photo_ref: dict[str, list[np.ndarray]] = {}
    photo_got: dict[str, list[np.ndarray]] = {}
    ref_parts: dict[str, list[np.ndarray]] = {}
    for case in cases:
        if case.outputs is None:
            raise ValueError(f"case {case.label!r} has no reference outputs")
        got = run(case.feed)
        try:
            ref_rows, got_rows = adapter.parity_outputs(case.outputs, got, metadata)
        except KeyError as exc:
            raise ValueError(f"the candidate has no output {exc}") from exc
        gated = case.kind == "photo" or not photos_only
        stats = []
        for part in parts:
            try:
                s = output_stats(part.name, part.take(ref_rows), part.take(got_rows))
            except KeyError as exc:
                raise ValueError(f"the candidate has no output {exc}") from exc
            stats.append({"part": part.name, **s.to_json()})
            ref_parts.setdefault(part.name, []).append(np.asarray(part.take(ref_rows)))
            _worst((result.worst if gated else result.structure).setdefault(part.name, {}), s)
        result.cases.append({"input": case.label, "kind": case.kind, "outputs": stats,
                             **({} if gated else {"gated": "finite only"})})
        if case.kind == "photo":
            for out_name, ref in case.outputs.items():
                photo_ref.setdefault(out_name, []).append(ref)
                photo_got.setdefault(out_name, []).append(got[out_name])
    if not result.cases:
        result.checks.append(Check.unmet(name, "parity: no inputs compared"))
        return result
    if photos_only and not photo_ref:
        result.checks.append(Check.unmet(name, f"parity: no photographs compared ({precision} is judged on in-distribution "
                                         "inputs; pass --images DIR)"))
    for part in parts:
        tol = result.limits[part.name]
        if part.name in result.worst:
            w = result.worst[part.name]
            checks = [_check(name, f"parity {part.name} {stat}", w[stat], STATISTICS[stat].op, limit)
                      for stat, limit in {"finite": 1.0, **tol.limits()}.items()]
            variation = input_variation(ref_parts.get(part.name, []))
            if variation is not None and variation < VARIES:
                # a failed statistic still shows a difference; a passed one shows nothing, and is not kept
                result.checks.extend(c for c in checks if not c.passed)
                _constant_part(result, part.name, variation, require_task)
            else:
                result.checks.extend(checks)
        if part.name in result.structure:
            w = result.structure[part.name]
            result.checks.append(_check(name, f"parity {part.name} finite (random inputs)", w["finite"], ">=", 1.0))
    if result.structure:
        figures = ", ".join(f"{p} rel L2 {w['rel_l2']:.3g}" for p, w in result.structure.items())
        result.notes.append(f"random inputs: {precision} parity judged on the photographs; on noise, out of the "
                            f"calibrated range, only finite outputs are gated ({figures})")
    _task_checks(result, adapter, gates, precision, metadata, photo_ref, photo_got, require_task, intervals)
    return result


def input_variation(outputs: list[np.ndarray]) -> float | None:
    """How much a reference output changes with its input: the largest rel L2 between the first
    input's output and another's of the same shape. None where fewer than two can be compared."""
    same = [np.asarray(o, dtype=np.float64) for o in outputs if np.shape(o) == np.shape(outputs[0])] if outputs else []
    if len(same) < 2:
        return None
    first = same[0]
    norm = float(np.linalg.norm(first))
    worst = 0.0
    for other in same[1:]:
        diff = float(np.linalg.norm(other - first))
        if not np.isfinite(diff):
            return None  # not finite: the finite check says so
        worst = max(worst, diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf")))
    return worst


def _constant_part(result: Comparison, part: str, variation: float, require_task: bool) -> None:
    """A part whose reference does not depend on the input: none of its statistics is shown as passed
    (none could have failed); a gate that must compare something fails, others say so in their notes."""
    result.constant[part] = variation
    what = (f"nothing to compare (the reference's {part} is the same for every input: "
            f"rel L2 {variation:.2g} between inputs)")
    if require_task:
        result.checks.append(Check(result.name, f"parity {part}: {what}", variation, ">=", VARIES, False))
    else:
        result.notes.append(f"parity {part} not gated: {what}")


def _photo_batch(outputs: dict[str, list[np.ndarray]]):
    """The photographs' outputs as one batch per output; photographs letterboxed to their own rectangles give
    outputs of other sizes: then a list of one output dict per photograph (instance families take both)."""
    if all(len({o.shape for o in v}) == 1 for v in outputs.values()):
        return {k: np.concatenate(v) for k, v in outputs.items()}
    count = len(next(iter(outputs.values())))
    return [{k: v[i] for k, v in outputs.items()} for i in range(count)]


def _task_checks(result: Comparison, adapter, gates, precision, metadata, photo_ref, photo_got, require_task,
                 intervals: bool = True) -> None:
    name = result.name
    if not photo_ref:
        if require_task:
            result.checks.append(Check.unmet(name, "task: no photographs compared"))
        else:
            result.notes.append("task metrics not computed: no photographs among the inputs")
        return
    ref_batch, got_batch = _photo_batch(photo_ref), _photo_batch(photo_got)
    rated = intervals and precision in PRECISIONS and PRECISIONS[precision].reduced  # decided on their intervals
    options = {**gates.options(precision), **({"intervals": 1.0} if rated else {})}
    result.task = adapter.task_metrics(ref_batch, got_batch, metadata, options)
    result.task_gates = gates.task(precision)
    if result.task.get("compared", 1.0) <= 0:
        what = adapter.nothing_to_compare(result.task)
        if require_task:
            result.checks.append(Check.unmet(name, f"task: nothing to compare ({what})"))
        else:
            result.notes.append(f"task metrics not gated: nothing to compare ({what})")
        return
    images = len({c["input"].split(" @")[0] for c in result.cases if c.get("kind") == "photo"}) or \
        len(next(iter(photo_ref.values())))
    # one mechanism: a reduced precision's shares and mAPs are decided on their 95% intervals; a minimum count the
    # user sets (--tol min_detections=N, 0: none) asks for the older rule instead: point figures above N detections
    by_interval = rated and gates.tolerances.get(precision, "min_detections", None) is None
    minimum = gates.sample_minimum(precision) if any(m in RATE_GATES for m in result.task_gates) else 0
    found = result.task.get("reference_detections", result.task.get("compared", 0.0))
    if minimum and found < minimum:
        wanted = int(math.ceil(images * minimum / found))
        what = (f"not enough evidence: {found:g} reference detections on {images} image{'s' * (images != 1)}, too few "
                f"to judge the {_rule(result.task_gates)} (one flip is {100 / found:.0f}%; it takes {minimum}); verify "
                f"on about {wanted} images of what the model sees (--images DIR --image-count {wanted})")
        if require_task:
            result.checks.append(Check(name, f"task: {what}", found, ">=", float(minimum), False,
                                       key="task: enough reference detections"))
        else:
            result.notes.append(f"task metrics: {what}")
    for metric, (op, limit) in result.task_gates.items():
        value = result.task.get(metric, float("nan"))
        counts = _rate_counts(result.task, metric)
        bounds = (result.task.get(f"{metric}_low"), result.task.get(f"{metric}_high"))
        if by_interval and counts is not None:  # a share decided on its exact 95% interval
            check = rate_check(name, metric, *counts, op, limit, images)
        elif by_interval and None not in bounds:  # an mAP decided on its bootstrap interval over the photographs
            check = interval_check(name, metric, value, Interval(float(bounds[0]), float(bounds[1])), op, limit,
                                   images)
        else:
            check = _check(name, f"task {metric}", value, op, limit)
            if counts is not None:  # how sure the share is: its exact 95% interval, shown and stored beside it
                check.interval = rate_interval(*counts).to_json()
            elif None not in bounds:
                check.interval = [float(bounds[0]), float(bounds[1])]
        if not check.passed and UNDECIDED in check.name and not require_task:
            result.notes.append(f"{check.name} (not gated here)")
            continue
        result.checks.append(check)


def interval_check(artifact: str, metric: str, value: float, interval: Interval, op: str, limit: float,
                   images: int) -> Check:
    """A figure over images decided on its bootstrap interval: as ``rate_check``."""
    verdict = decide(interval, op, limit)
    name = f"task {metric}"
    if verdict == "undecided":
        need = images_to_decide(interval, value, limit, images)
        name = (f"task {metric}: not enough evidence: {metric} {value:.3g} is between {interval.low:.3f} and "
                f"{interval.high:.3f} on {images} image(s); about {need} images of what the model sees would decide "
                f"(--images DIR --image-count {need})")
    return Check(artifact, name, value, op, limit, verdict == "pass", key=f"task {metric}", interval=interval.to_json())


def _rate_counts(task: dict[str, float], metric: str) -> tuple[int, int] | None:
    """(kept, of) behind a share gate: recall is the reference's detections the candidate kept, precision the
    candidate's that the reference has."""
    if metric not in RATE_GATES or metric not in task:
        return None
    # the detections that decide the share: those near the operating point that crossed it by no more than the
    # scores move are left out (``compare.instances``: threshold flips)
    side = "reference" if metric == "recall" else "candidate"
    of = task.get(f"decided_{side}", task.get(f"{side}_detections"))
    if of is None:
        return None
    return int(round(task[metric] * of)), int(of)


def rate_check(artifact: str, metric: str, kept: int, of: int, op: str, limit: float, images: int) -> Check:
    """A share gate decided on its exact 95% interval (``compare.intervals``): it passes where the whole interval is
    within the limit, fails where none of it is, and is otherwise "not enough evidence", saying about how many images
    of the same kind would decide (a failed check: the same verdict in export, build and verify)."""
    interval = rate_interval(kept, of)
    verdict = decide(interval, op, limit)
    value = kept / of if of else 0.0
    name = f"task {metric}"
    if verdict == "undecided":
        trials = rate_trials_to_decide(kept, of, op, limit)
        per_image = of / max(images, 1) if of else 1.0
        need = int(math.ceil(trials / max(per_image, 1e-9)))
        decide_on = (f"about {need} images of what the model sees would decide (--images DIR --image-count {need})"
                     if trials < 100_000 else "more images do not decide a share at its limit")
        name = (f"task {metric}: not enough evidence: {metric} {value:.3g} is between {interval.low:.3f} and "
                f"{interval.high:.3f} on {of} detection(s) of {images} image(s); {decide_on}")
    return Check(artifact, name, value, op, limit, verdict == "pass", key=f"task {metric}", interval=interval.to_json())


def _rule(task_gates: dict[str, tuple[str, float]]) -> str:
    """``5% rule``: the share of detections the recall and precision gates let go."""
    limits = [limit for metric, (_, limit) in task_gates.items() if metric in RATE_GATES]
    return f"{100 * (1 - max(limits)):.3g}% rule"
