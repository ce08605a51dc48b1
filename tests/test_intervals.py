"""The intervals a verdict rests on (``enginekit.compare.intervals``) cover the true figure at about the stated rate,
on simulated images whose true drop is known; and a gate decides only where its interval does.

- the exact binomial interval of a share (recall: k of n detections kept) covers the true share at least 95% of the
  time (Clopper-Pearson is conservative) and not far more;
- the paired bootstrap over images of a drop (reference minus candidate, the same resampled images for both) covers
  the known drop about 95% of the time: a top-1 accuracy over images, and an mAP50-95 by Ultralytics' own metrics;
- resampled unpaired (each side on other images), the same interval is too wide: the pairing is what is measured.
"""

from __future__ import annotations

import numpy as np
import pytest

from enginekit.compare import intervals
from enginekit.compare.intervals import Interval, decide, paired_drop, rate_interval, resamples


def test_the_exact_interval_of_a_share_covers_it_at_least_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    for p, n in ((0.96, 60), (0.9, 25), (0.99, 300)):
        kept = rng.binomial(n, p, size=4000)
        ci = {int(k): rate_interval(int(k), n) for k in np.unique(kept)}
        covered = np.mean([ci[int(k)].low <= p <= ci[int(k)].high for k in kept])
        assert 0.95 <= covered <= 0.995, (p, n, covered)
    from scipy.stats import binomtest  # the same interval as scipy's own exact method

    exact = binomtest(57, 60).proportion_ci(method="exact")
    assert np.allclose([exact.low, exact.high], [rate_interval(57, 60).low, rate_interval(57, 60).high])


def _top1_world(rng, images: int, drop_flip: float = 0.05, gain_flip: float = 0.01, base: float = 0.8):
    ref = rng.random(images) < base
    cand = ref.copy()
    cand[ref & (rng.random(images) < drop_flip)] = False
    cand[~ref & (rng.random(images) < gain_flip)] = True
    return ref.astype(float), cand.astype(float)


def _replicates(hits: np.ndarray, paired: bool = True, salt: int = 0) -> np.ndarray:
    idx = resamples(len(hits)) if paired else np.random.default_rng(salt).integers(0, len(hits), (1000, len(hits)))
    return hits[idx].mean(axis=1)


def test_the_paired_bootstrap_covers_a_known_top1_drop_at_about_95_percent():
    rng = np.random.default_rng(2)
    true_drop = 0.8 * 0.05 - 0.2 * 0.01  # lost where the reference was right, gained where it was wrong: 0.038
    covered, unpaired_width, paired_width = [], [], []
    for trial in range(300):
        ref, cand = _top1_world(rng, 200)
        interval = paired_drop(_replicates(ref), _replicates(cand))
        covered.append(interval.low <= true_drop <= interval.high)
        paired_width.append(interval.high - interval.low)
        apart = paired_drop(_replicates(ref, False, trial), _replicates(cand, False, trial + 10_000))
        unpaired_width.append(apart.high - apart.low)
    assert 0.9 <= np.mean(covered) <= 0.99, np.mean(covered)
    assert np.median(unpaired_width) > 2 * np.median(paired_width), (np.median(unpaired_width), np.median(paired_width))


def test_the_paired_bootstrap_covers_a_known_map_drop(monkeypatch):
    """Images of 3 objects each; the candidate misses each object with a known probability, so its mAP50-95 on a
    large population gives the true drop; on samples of 40 images the interval of Ultralytics' mAP covers it at about
    the stated rate."""
    from enginekit.compare.instances import Instances, box_iou
    from enginekit.compare.label_metrics import InstanceScores

    monkeypatch.setattr(intervals, "REPLICATES", 1)  # the population's figure needs no interval

    def world(rng, n, miss):
        shots = []
        for _ in range(n):
            xy = rng.uniform(0, 500, (3, 2))
            boxes = np.concatenate([xy, xy + rng.uniform(40, 120, (3, 2))], 1).astype(np.float32)
            truth = Instances(boxes, np.ones(3, np.float32), rng.integers(0, 2, 3))
            jitter = boxes + rng.normal(0, 3, boxes.shape).astype(np.float32)
            scores = rng.uniform(0.3, 1.0, 3).astype(np.float32)
            ref = Instances(jitter, scores, truth.classes)
            keep = rng.random(3) >= miss
            cand = Instances(jitter[keep], scores[keep], truth.classes[keep])
            shots.append((truth, ref, cand))
        return shots

    def scores(shots, side):
        s = InstanceScores("detect", {0: "a", 1: "b"}, box_iou)
        for truth, ref, cand in shots:
            s.add(truth, ref if side == "ref" else cand)
        return s.result()

    rng = np.random.default_rng(3)
    population = world(rng, 2000, 0.1)
    true_drop = scores(population, "ref")["map50_95"] - scores(population, "cand")["map50_95"]
    assert 0.02 < true_drop < 0.2, true_drop
    monkeypatch.setattr(intervals, "REPLICATES", 150)
    covered = []
    for _ in range(30):
        shots = world(rng, 40, 0.1)
        a, b = scores(shots, "ref"), scores(shots, "cand")
        interval = paired_drop(a["replicates"]["map50_95"], b["replicates"]["map50_95"])
        covered.append(interval.low <= true_drop <= interval.high)
    assert 0.8 <= np.mean(covered) <= 1.0, np.mean(covered)


@pytest.mark.parametrize("interval,op,limit,verdict", [
    (Interval(0.0, 0.02), "<=", 0.03, "pass"), (Interval(0.04, 0.06), "<=", 0.03, "fail"),
    (Interval(0.01, 0.05), "<=", 0.03, "undecided"), (Interval(0.96, 1.0), ">=", 0.95, "pass"),
    (Interval(0.9, 0.94), ">=", 0.95, "fail"), (Interval(0.93, 1.0), ">=", 0.95, "undecided")])
def test_a_gate_decides_only_where_its_interval_does(interval, op, limit, verdict):
    assert decide(interval, op, limit) == verdict


def test_a_share_on_few_detections_is_not_enough_evidence_and_on_many_it_is():
    from enginekit.compare.comparison import rate_check

    few = rate_check("int8", "recall", 12, 12, ">=", 0.95, 2)  # every one of 12 kept: not enough to say 95%
    assert not few.passed and "not enough evidence" in few.name and "images" in few.name, few.name
    many = rate_check("int8", "recall", 200, 200, ">=", 0.95, 40)
    assert many.passed and many.interval[0] > 0.95
    lossy = rate_check("int8", "recall", 150, 200, ">=", 0.95, 40)
    assert not lossy.passed and "not enough evidence" not in lossy.name and lossy.interval[1] < 0.95
