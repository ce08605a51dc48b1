"""Gates that can fail: outputs compared by meaning, task metrics at the operating point.

The unit tests build YOLO-shaped outputs by hand (boxes + class probabilities) so that what
changes is known exactly; the tests on the trained detector check the same gates end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from enginekit.compare.comparison import Gates, SimpleCase, compare, parse_overrides
from enginekit.errors import UsageError

NC = 3


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def yolo_output(seed: int = 0, batch: int = 2, objects: int = 6, anchors: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """(output0 (B, 4+NC, A), class logits): a few well-separated objects among low-score anchors."""
    rng = np.random.default_rng(seed)
    out = np.zeros((batch, 4 + NC, anchors), dtype=np.float32)
    logits = rng.normal(-7.0, 1.0, size=(batch, NC, anchors)).astype(np.float32)
    out[:, 0] = rng.uniform(20, 620, size=(batch, anchors))
    out[:, 1] = rng.uniform(20, 620, size=(batch, anchors))
    out[:, 2:4] = rng.uniform(8, 40, size=(batch, 2, anchors))
    for b in range(batch):
        for k in range(objects):  # object k at a grid position, scored 0.4 .. 0.95, several anchors each
            cx, cy = 60 + 90 * (k % 6), 80 + 200 * (k // 6)
            a = 3 * k
            out[b, 0:4, a:a + 3] = np.array([cx, cy, 60, 50], dtype=np.float32)[:, None] + rng.normal(0, 1.5, (4, 3))
            logits[b, k % NC, a:a + 3] = np.log(p := np.linspace(0.45, 0.95, objects)[k]) - np.log(1 - p) - \
                np.array([0.0, 0.8, 1.5])
    out[:, 4:] = _sigmoid(logits)
    return out, logits


def yolo_adapter():
    from enginekit.families import resolve

    return resolve("yolo12n")


def cases_of(ref: np.ndarray, kind: str = "photo") -> list[SimpleCase]:
    return [SimpleCase(f"{kind} {i}", kind, {"images": np.full((1,), i, dtype=np.float32)}, {"output0": ref[i:i + 1]})
            for i in range(len(ref))]


def run_with(candidate: np.ndarray):
    return lambda feed: {"output0": candidate[int(feed["images"][0]):int(feed["images"][0]) + 1]}


def test_yolo_declares_boxes_and_scores():
    adapter = yolo_adapter()
    parts = {p.name: p for p in adapter.output_parts({})}
    assert list(parts) == ["boxes", "scores"]
    ref, _ = yolo_output()
    assert parts["boxes"].take({"output0": ref}).shape == (2, 4, 400)
    assert parts["scores"].take({"output0": ref}).shape == (2, NC, 400)
    e2e = {p.name: p for p in adapter.output_parts({"end2end": "True"})}
    assert list(e2e) == ["boxes", "scores", "classes"]
    assert e2e["classes"].take({"output0": np.zeros((1, 300, 6))}).shape == (1, 300, 1)


def test_identical_outputs_pass_with_figures():
    ref, _ = yolo_output()
    found = compare(run_with(ref.copy()), cases_of(ref), adapter=yolo_adapter(), gates=Gates(yolo_adapter()),
                    precision="fp16")
    assert found.passed, found.failures()
    assert found.task["reference_detections"] == 12 and found.task["recall"] == 1.0
    # Ultralytics integrates 101 points with the trapezoid rule: a perfect ranking scores 0.995
    assert found.task["map50"] == pytest.approx(0.995) and found.task["map50_95"] == pytest.approx(0.995)
    assert found.task["score_shift_max"] == 0.0
    assert set(found.worst) == {"boxes", "scores"}


def test_shifting_only_the_class_scores_fails_the_scores_part():
    """The issue's tamper: every class logit - 1. Boxes untouched; whole-tensor rel L2 barely moves."""
    ref, logits = yolo_output()
    bad = ref.copy()
    bad[:, 4:] = _sigmoid(logits - 1.0)
    adapter = yolo_adapter()
    whole = np.linalg.norm(bad - ref) / np.linalg.norm(ref)
    assert whole < 2e-2  # the old whole-output gate (FP16 rel L2 2e-2) would pass this
    found = compare(run_with(bad), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="fp16")
    failed = {c.name for c in found.checks if not c.passed}
    assert not found.passed
    assert "parity scores rel_l2" in failed and "parity scores max_abs" in failed
    assert not any(name.startswith("parity boxes") for name in failed)
    assert "task recall" in failed  # scores near 0.25 fall below it
    assert found.task["score_shift_max"] > 0.05


def test_small_noise_passes_and_is_measured():
    ref, logits = yolo_output()
    rng = np.random.default_rng(1)
    cand = ref.copy()
    cand[:, :4] += rng.normal(0, 0.05, cand[:, :4].shape).astype(np.float32)
    cand[:, 4:] = _sigmoid(logits + rng.normal(0, 0.002, logits.shape)).astype(np.float32)
    adapter = yolo_adapter()
    found = compare(run_with(cand), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="fp16")
    assert found.passed, found.failures()
    assert 0 < found.worst["scores"]["max_abs"] < 2e-3
    assert 0 < found.task["score_shift_mean"] < 2e-3
    assert found.task["map50_95"] <= 1.0


def test_lost_detection_fails_recall_and_extra_fails_precision():
    ref, logits = yolo_output(objects=6, batch=2)
    adapter = yolo_adapter()
    lost = ref.copy()
    lost[0, 4:, 0:3] = 0.01  # object 0 of image 0 gone: 11 of 12 kept (91.7% < 95%)
    found = compare(run_with(lost), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="int8")
    assert found.task["recall"] == pytest.approx(11 / 12)
    assert {c.name for c in found.checks if not c.passed} >= {"task recall"}
    extra = ref.copy()
    extra[1, 0:4, 390] = [600, 600, 30, 30]
    extra[1, 4, 390] = 0.9  # a detection the reference does not have
    found = compare(run_with(extra), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="int8")
    assert found.task["precision"] == pytest.approx(12 / 13)
    assert "task precision" in {c.name for c in found.checks if not c.passed}


def test_nothing_to_compare_fails_with_the_reason():
    """A random-weight YOLO scores below 0.25 everywhere: the task check compares nothing and fails."""
    ref, _ = yolo_output()
    ref[:, 4:] = np.minimum(ref[:, 4:], 0.1)
    adapter = yolo_adapter()
    found = compare(run_with(ref.copy()), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="fp16")
    assert not found.passed
    (failed,) = [c for c in found.checks if not c.passed]
    assert "nothing to compare" in failed.name and "no detections at conf 0.25" in failed.name
    # export/build parity note it instead (the parity parts still gate)
    found = compare(run_with(ref.copy()), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="fp16",
                    require_task=False)
    assert found.passed and "nothing to compare" in found.notes[0]
    # a lower operating point finds them again
    found = compare(run_with(ref.copy()), cases_of(ref), adapter=adapter,
                    gates=Gates(adapter, parse_overrides(["conf=0.05"])), precision="fp16")
    assert found.passed and found.task["conf"] == 0.05 and found.task["reference_detections"] > 0


def test_random_cases_gate_parity_but_not_the_task():
    ref, _ = yolo_output()
    adapter = yolo_adapter()
    found = compare(run_with(ref.copy()), cases_of(ref, "random"), adapter=adapter, gates=Gates(adapter),
                    precision="fp16")
    assert [c.name for c in found.checks if not c.passed] == ["task: photographs compared"]


def test_overrides_by_part_precision_and_option():
    adapter = yolo_adapter()
    gates = Gates(adapter, parse_overrides(["scores.max_abs=0.5", "fp16.rel_l2=0.1", "int8.map50=0.7", "conf=0.1"]))
    assert gates.parity("fp16", "scores").max_abs == 0.5
    assert gates.parity("fp16", "boxes").rel_l2 == 0.1 and gates.parity("int8", "boxes").rel_l2 != 0.1
    assert gates.task("int8")["map50"] == (">=", 0.7) and gates.task("fp16")["map50"] == (">=", 0.9)
    assert gates.options("fp16") == {"conf": 0.1}
    with pytest.raises(UsageError, match="unknown tolerance 'scores.recall'"):
        Gates(adapter, {"scores.recall": 0.5})
    with pytest.raises(UsageError, match="unknown tolerance 'rel_2'"):
        Gates(adapter, {"rel_2": 0.5})


def test_depth_nothing_to_compare_fails():
    from enginekit.families import resolve

    adapter = resolve("depth")
    ref = np.zeros((1, 28, 28), dtype=np.float32)
    cases = [SimpleCase("photo", "photo", {"pixel_values": np.zeros(1)}, {"depth": ref})]
    found = compare(lambda feed: {"depth": ref}, cases, adapter=adapter, gates=Gates(adapter), precision="fp16")
    assert not found.passed and any("nothing to compare" in c.name for c in found.checks)


def test_statistics_agree_with_polygraphy():
    """max / median absolute error as Polygraphy's SimpleCompareFunc computes them."""
    from polygraphy.comparator import CompareFunc
    from polygraphy.comparator.struct import IterationResult
    from polygraphy.logger import G_LOGGER

    from enginekit.compare.metrics import output_stats

    G_LOGGER.module_severity = G_LOGGER.CRITICAL
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(2, 7, 50)).astype(np.float32)
    got = ref + rng.normal(0, 1e-2, size=ref.shape).astype(np.float32)
    ours = output_stats("x", ref, got)
    func = CompareFunc.simple(check_error_stat="quantile", error_quantile=0.99)
    theirs = func(IterationResult({"x": got}, runner_name="a"), IterationResult({"x": ref}, runner_name="b"))["x"]
    assert ours.max_abs == pytest.approx(theirs.max_absdiff, rel=1e-6)
    assert ours.median_abs == pytest.approx(theirs.median_absdiff, rel=1e-6)
    assert ours.p99_abs == pytest.approx(theirs.quantile_absdiff, rel=1e-3)
