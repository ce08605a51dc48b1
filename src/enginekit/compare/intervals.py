"""How sure a figure over images is: 95% intervals, and a gate that decides only where the interval does.

A figure measured over images is a sample of what the artifact does on images of that kind. Two intervals:

- a rate (recall, precision: k of n detections kept) gets the exact binomial interval (Clopper-Pearson: the beta
  quantiles ``scipy.stats.binomtest(...).proportion_ci(method="exact")`` inverts);
- any other figure over images (an mAP, its drop against the FP32 model on the same images, a top-1 accuracy)
  gets a paired bootstrap over images: the images are resampled with replacement, ``REPLICATES`` times with a seed
  fixed by their number, and the figure recomputed on each resample for the reference and the candidate alike (the
  same images for both: paired), the interval being the 2.5th and 97.5th percentiles of the replicates.

A gate ``value OP limit`` then passes when the whole interval satisfies it, fails when none of it does, and is
otherwise not decided: "not enough evidence: the drop is between a and b; about N images would decide" (a failed
check: exit 1). ``images_to_decide`` estimates N from the interval's width, which shrinks as one over the square root
of the number of images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: bootstrap replicates per figure (the percentiles of 1000 replicates move by about 0.002 of a typical mAP drop)
REPLICATES = 1000
CONFIDENCE = 0.95
#: what a check says where its interval straddles its limit (it decided nothing; ``verification.record`` reads it)
UNDECIDED = "not enough evidence"


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def to_json(self) -> list[float]:
        return [round(self.low, 6), round(self.high, 6)]

    def __str__(self) -> str:
        return f"[{self.low:.4g}, {self.high:.4g}]"


def rate_interval(successes: int, trials: int, confidence: float = CONFIDENCE) -> Interval:
    """The exact binomial (Clopper-Pearson) interval of a rate ``successes / trials``; [0, 1] for no trials."""
    if trials <= 0:
        return Interval(0.0, 1.0)
    from scipy.stats import beta

    # the quantiles of the beta distributions binomtest's "exact" method inverts (the same interval, without the
    # p-value binomtest computes first)
    k, n, tail = int(successes), int(trials), (1.0 - confidence) / 2
    low = 0.0 if k == 0 else float(beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - tail, k + 1, n - k))
    return Interval(low, high)


def resamples(count: int, replicates: int | None = None) -> np.ndarray:
    """(replicates, count) image indices, drawn with replacement; the seed is fixed by ``count``, so a reference and
    a candidate scored on the same images are resampled alike (paired)."""
    replicates = REPLICATES if replicates is None else replicates
    rng = np.random.default_rng(20_261_201 + count)
    return rng.integers(0, count, size=(replicates, count)) if count else np.zeros((replicates, 0), np.int64)


def percentile_interval(values, confidence: float = CONFIDENCE) -> Interval:
    values = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if not values.size:
        return Interval(float("nan"), float("nan"))
    tail = (1.0 - confidence) / 2 * 100
    return Interval(float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail)))


def paired_drop(reference: list[float], candidate: list[float]) -> Interval:
    """The interval of a drop (reference - candidate) from the two sides' replicates on the same resamples."""
    n = min(len(reference), len(candidate))
    return percentile_interval(np.asarray(reference[:n], dtype=np.float64) - np.asarray(candidate[:n], dtype=np.float64))


def decide(interval: Interval, op: str, limit: float) -> str:
    """"pass" where the whole interval satisfies ``OP limit``, "fail" where none of it does, else "undecided"."""
    low, high = interval.low, interval.high
    if not (math.isfinite(low) and math.isfinite(high)):
        return "undecided"
    if op == "<=":
        return "pass" if high <= limit else ("fail" if low > limit else "undecided")
    if op == ">=":
        return "pass" if low >= limit else ("fail" if high < limit else "undecided")
    raise ValueError(f"no decision for {op!r}")


def images_to_decide(interval: Interval, value: float, limit: float, images: int) -> int:
    """About how many images would give an interval around ``value`` that clears ``limit`` (the half-width shrinks as
    one over the square root of the images); images + 1 at least."""
    half = max((interval.high - interval.low) / 2, 1e-12)
    gap = abs(limit - value)
    if gap <= 1e-12:
        return max(images * 100, images + 1)
    return max(images + 1, int(math.ceil(images * (half / gap) ** 2)))


def rate_trials_to_decide(successes: int, trials: int, op: str, limit: float, cap: int = 100_000) -> int:
    """The fewest trials at the observed rate whose exact interval would lie wholly on one side of ``limit``: a pass
    above it, a failure under it (a rate exactly at the limit never decides: ``cap``)."""
    rate = successes / trials if trials else 1.0
    if rate == limit:
        return cap

    def passes(n: int) -> bool:
        return decide(rate_interval(int(round(rate * n)), n), op, limit) != "undecided"

    low = high = max(trials + 1, 2)
    while not passes(high):  # an upper bound, growing geometrically ...
        low = high
        high = int(high * 1.25) + 1
        if high >= cap:
            return cap
    while low < high:  # ... then the fewest between (the interval narrows with n: about monotone)
        mid = (low + high) // 2
        if passes(mid):
            high = mid
        else:
            low = mid + 1
    return high
