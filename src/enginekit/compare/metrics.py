"""The statistics: one table of every figure a comparison reports or a gate limits.

Each statistic has a name, how it is computed (parity statistics here; task metrics by the
family), which way is worse (``op``: a limit on it is a maximum, ``<=``, or a minimum, ``>=``),
and what values a limit may take. The comparison (which figure of several cases is the worst),
the gates and ``--tol`` (limits and their ranges), the reports (``rel L2 <= 0.02``) and repair
(the error a node adds) all read it here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Callable, Optional

import numpy as np


class Pair:
    """A reference and a candidate output, flattened to float64, with the terms statistics share."""

    def __init__(self, reference: np.ndarray, candidate: np.ndarray):
        self.ref = np.asarray(reference, dtype=np.float64).ravel()
        self.got = np.asarray(candidate, dtype=np.float64).ravel()

    @cached_property
    def diff(self) -> np.ndarray:
        return np.abs(self.got - self.ref)

    @cached_property
    def rel(self) -> np.ndarray:
        """Relative error per element, floored so near-zero references do not explode it."""
        scale = max(float(np.abs(self.ref).max()), 1e-12)
        return self.diff / np.maximum(np.abs(self.ref), 1e-3 * scale)

    @cached_property
    def ref_norm(self) -> float:
        return float(np.linalg.norm(self.ref))

    @cached_property
    def got_norm(self) -> float:
        return float(np.linalg.norm(self.got))


def _rel_l2(p: Pair) -> float:
    return float(np.linalg.norm(p.got - p.ref) / max(p.ref_norm, 1e-12))


def _cosine(p: Pair) -> float:
    if p.ref_norm > 0 and p.got_norm > 0:
        return float(p.ref @ p.got / (p.ref_norm * p.got_norm))
    return float(p.ref_norm == p.got_norm)


def _psnr(p: Pair) -> float:
    mse = float(np.mean(p.diff**2))
    peak = float(np.abs(p.ref).max())
    return float("inf") if mse == 0 else float(10 * np.log10(max(peak, 1e-12) ** 2 / mse))


def passes(op: str, value: float, limit: float) -> bool:
    """``value`` within ``limit`` (``op`` "<=": at most, ">=": at least); NaN fails either way."""
    return bool(value <= limit) if op == "<=" else bool(value >= limit)


@dataclass(frozen=True)
class Statistic:
    name: str
    label: str  # in tables and limits: "rel L2"
    #: "<=": a limit is the most it may be (lower is better); ">=": the least (higher is better); "": an option
    op: str
    meaning: str  # what a limit on it means
    #: parity: of a Pair; None: a task metric or option, computed (or used) by the family
    function: Optional[Callable[[Pair], float]] = None
    kind: str = "parity"  # "parity" | "task" (a family's task metric) | "option" (a family's task option)
    #: the values a limit may take: (low, high), each end open (excluded) unless named in ``closed``
    limits: tuple[float, float] = (0.0, math.inf)
    closed: tuple[str, ...] = ()  # "low", "high"
    tolerance: bool = False  # parity: a ``--tol`` may limit it, per output part

    def worse(self, a: float, b: float) -> float:
        """The worse of two values (NaN is the worst)."""
        if math.isnan(a) or math.isnan(b):
            return math.nan
        return max(a, b) if self.op == "<=" else min(a, b)

    @property
    def worst(self) -> float:
        """Its value for an output that is not finite: as bad as it gets."""
        return math.inf if self.op == "<=" else 0.0

    def limit_problem(self, value: float) -> Optional[str]:
        """Why ``value`` cannot be a limit (or option value) of this statistic; None: it can."""
        low, high = self.limits
        above = value >= low if "low" in self.closed else value > low
        below = value <= high if "high" in self.closed else value < high
        if math.isfinite(value) and above and below:
            return None
        if math.isinf(high):
            return f"{value:g} is not a {'non-negative' if 'low' in self.closed else 'positive'} finite number"
        return f"{value:g} is not {self.range_text()}"

    def range_text(self) -> str:
        """``a number in (0, 1]``"""
        low, high = self.limits
        if math.isinf(high):
            return f"a number {'>=' if 'low' in self.closed else '>'} {low:g}"
        left, right = "[" if "low" in self.closed else "(", "]" if "high" in self.closed else ")"
        return f"a number in {left}{low:g}, {high:g}{right}"

    def describe_limit(self, limit: float) -> str:
        """``rel L2 <= 0.02`` (an option: ``conf 0.1``)"""
        return f"{self.label} {self.op} {limit:g}" if self.op else f"{self.label} {limit:g}"


_RATIO = dict(limits=(0.0, 1.0), closed=("low", "high"))  # a share: 0 (no gate) to 1 (all)

STATISTICS: dict[str, Statistic] = {s.name: s for s in (
    # parity: per output part, the candidate's outputs against the reference's
    Statistic("rel_l2", "rel L2", "<=", "the L2 norm of the error over the reference's", _rel_l2, tolerance=True),
    Statistic("cosine", "cosine", ">=", "the least cosine similarity of candidate and reference", _cosine,
              limits=(0.0, 1.0), closed=("high",), tolerance=True),
    Statistic("max_abs", "max abs", "<=", "the largest absolute error, in the part's own units",
              lambda p: float(p.diff.max()), tolerance=True),
    Statistic("median_abs", "median abs", "<=", "the median absolute error", lambda p: float(np.median(p.diff))),
    Statistic("p99_abs", "p99 abs", "<=", "the 99th percentile of the absolute error",
              lambda p: float(np.percentile(p.diff, 99))),
    Statistic("max_rel", "max rel", "<=", "the largest relative error (against 1e-3 of the largest reference)",
              lambda p: float(p.rel.max())),
    Statistic("median_rel", "median rel", "<=", "the median relative error", lambda p: float(np.median(p.rel))),
    Statistic("p99_rel", "p99 rel", "<=", "the 99th percentile of the relative error",
              lambda p: float(np.percentile(p.rel, 99))),
    Statistic("psnr", "PSNR dB", ">=", "the peak signal-to-noise ratio", _psnr),
    Statistic("finite", "finite", ">=", "every value finite (1) or not (0)",
              lambda p: float(np.isfinite(p.got).all()), limits=(0.0, 1.0), closed=("high",)),
    # task metrics: the family's, of the candidate's predictions against the reference's (as truth)
    Statistic("recall", "recall", ">=", "the least share of the reference's detections found", kind="task", **_RATIO),
    Statistic("precision", "precision", ">=", "the least share of detections the reference has too", kind="task",
              **_RATIO),
    Statistic("map50", "mAP50", ">=", "the least mAP at IoU 0.5", kind="task", **_RATIO),
    Statistic("map50_95", "mAP50-95", ">=", "the least mAP over IoU 0.5 to 0.95", kind="task", **_RATIO),
    Statistic("box_map50", "box mAP50", ">=", "the least box mAP at IoU 0.5", kind="task", **_RATIO),
    Statistic("mask_map50", "mask mAP50", ">=", "the least mask mAP at IoU 0.5", kind="task", **_RATIO),
    Statistic("mask_map50_95", "mask mAP50-95", ">=", "the least mask mAP over IoU 0.5 to 0.95", kind="task",
              **_RATIO),
    Statistic("pose_map50", "pose mAP50", ">=", "the least keypoint mAP at OKS 0.5", kind="task", **_RATIO),
    Statistic("pose_map50_95", "pose mAP50-95", ">=", "the least keypoint mAP over OKS 0.5 to 0.95", kind="task",
              **_RATIO),
    Statistic("top1_agreement", "top-1 agreement", ">=", "the least share of images with the reference's top class",
              kind="task", **_RATIO),
    Statistic("top5_overlap", "top-5 overlap", ">=", "the least share of the reference's top 5 in the candidate's",
              kind="task", **_RATIO),
    Statistic("miou", "mIoU", ">=", "the least mean IoU of the class maps", kind="task", **_RATIO),
    Statistic("pixel_accuracy", "pixel accuracy", ">=", "the least share of pixels of the reference's class",
              kind="task", **_RATIO),
    Statistic("abs_rel", "AbsRel", "<=", "the largest mean absolute relative depth error", kind="task"),
    Statistic("delta1", "delta1", ">=", "the least share of pixels within 1.25x of the reference's depth",
              kind="task", **_RATIO),
    # against labels (verify --data): the most a candidate's figure may fall below the FP32 PyTorch model's,
    # each a limit written gt.NAME (``--tol gt.map50_95_drop=0.01``)
    *(Statistic(f"{m}_drop", f"{label} drop", "<=", f"the most the candidate's {label} against the labels may fall "
                "below the FP32 PyTorch model's", kind="ground_truth", limits=(0.0, 1.0), closed=("low", "high"))
      for m, label in (("map50_95", "mAP50-95"), ("map50", "mAP50"), ("mask_map50_95", "mask mAP50-95"),
                       ("mask_map50", "mask mAP50"), ("pose_map50_95", "pose mAP50-95"), ("pose_map50", "pose mAP50"),
                       ("top1", "top-1"), ("top5", "top-5"), ("miou", "mIoU"), ("pixel_accuracy", "pixel accuracy"))),
    # task options: where the task metrics are computed, set like a tolerance
    Statistic("conf", "conf", "", "the confidence both sides' detections are kept at", kind="option",
              limits=(0.0, 1.0), closed=("high",)),
    Statistic("iou", "IoU", "", "the IoU two detections match at", kind="option", limits=(0.0, 1.0), closed=("high",)),
    Statistic("min_detections", "min detections", "", "decide a reduced precision's recall and precision on their "
              "point figures over at least this many reference detections (the older rule; 0: no minimum) instead "
              "of on their 95% intervals (the default)", kind="option", limits=(0.0, math.inf), closed=("low",)),
    Statistic("conf_margin", "conf margin", "", "the band around conf within which a matched detection's two scores "
              "may cross it as a threshold flip, deciding neither recall nor precision (default: measured from the "
              "matched scores' shifts, at most 0.05; 0: the plain rule)", kind="option", limits=(0.0, 1.0),
              closed=("low",)),
)}

#: parity statistics a tolerance can limit (``--tol rel_l2=...``, ``--tol scores.max_abs=...``)
PARITY_LIMITS: tuple[str, ...] = tuple(n for n, s in STATISTICS.items() if s.tolerance)
PARITY_STATISTICS: tuple[str, ...] = tuple(n for n, s in STATISTICS.items() if s.kind == "parity")
#: limits on a candidate's loss against labels (``--tol gt.NAME``), written with the ``gt`` part
GROUND_TRUTH_PART = "gt"
GROUND_TRUTH_LIMITS: tuple[str, ...] = tuple(n for n, s in STATISTICS.items() if s.kind == "ground_truth")


def statistic(name: str, reference: np.ndarray, candidate: np.ndarray) -> float:
    """One parity statistic of ``candidate`` against ``reference`` (``statistic("rel_l2", a, b)``)."""
    return STATISTICS[name].function(Pair(reference, candidate))


@dataclass
class OutputStats:
    name: str
    max_abs: float
    median_abs: float
    p99_abs: float
    max_rel: float
    median_rel: float
    p99_rel: float
    rel_l2: float
    cosine: float
    psnr: float
    finite: bool

    def to_json(self) -> dict:
        return {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in asdict(self).items()}


def output_stats(name: str, reference: np.ndarray, candidate: np.ndarray) -> OutputStats:
    """Every parity statistic of one output (part) of a candidate against the reference's."""
    pair = Pair(reference, candidate)
    if pair.ref.shape != pair.got.shape:
        raise ValueError(f"output {name}: shapes differ ({np.shape(reference)} vs {np.shape(candidate)})")
    finite = bool(np.isfinite(pair.got).all())
    values = {n: (STATISTICS[n].function(pair) if finite else STATISTICS[n].worst)
              for n in PARITY_STATISTICS if n != "finite"}
    return OutputStats(name=name, finite=finite, **values)
