"""Gates that can fail: outputs compared by meaning, task metrics at the operating point.

The unit tests build YOLO-shaped outputs by hand (boxes + class probabilities) so that what
changes is known exactly; the tests on the trained detector check the same gates end to end.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from enginekit.compare.comparison import Case, Gates, compare
from enginekit.compare.tolerances import Tolerances
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


def cases_of(ref: np.ndarray, kind: str = "photo") -> list[Case]:
    return [Case(f"{kind} {i}", kind, {"images": np.full((1,), i, dtype=np.float32)}, {"output0": ref[i:i + 1]})
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
    ref, _ = yolo_output(batch=13)  # 78 detections: a perfect share's interval clears the 5% rule (72, fewest_to_pass)
    found = compare(run_with(ref.copy()), cases_of(ref), adapter=yolo_adapter(), gates=Gates(yolo_adapter()),
                    precision="fp16")
    assert found.passed, found.failures()
    assert found.task["reference_detections"] >= 72 and found.task["recall"] == 1.0
    recall = next(c for c in found.checks if c.key == "task recall")
    assert recall.interval[0] >= 0.95 and recall.interval[1] == 1.0  # decided on the whole interval
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
    failed = {c.key or c.name for c in found.checks if not c.passed}
    assert not found.passed
    assert "parity scores rel_l2" in failed and "parity scores max_abs" in failed
    assert not any(name.startswith("parity boxes") for name in failed)
    assert "task recall" in failed  # scores near 0.25 fall below it
    assert found.task["score_shift_max"] > 0.05


def test_small_noise_passes_and_is_measured():
    ref, logits = yolo_output(batch=13)  # 78 detections: enough for a share's interval to clear its limit
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
    assert {c.key or c.name for c in found.checks if not c.passed} >= {"task recall"}
    extra = ref.copy()
    extra[1, 0:4, 390] = [600, 600, 30, 30]
    extra[1, 4, 390] = 0.9  # a detection the reference does not have
    found = compare(run_with(extra), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="int8")
    assert found.task["precision"] == pytest.approx(12 / 13)
    assert "task precision" in {c.key or c.name for c in found.checks if not c.passed}
    # on 78 detections, 10 lost: the whole interval is under the limit, a decided failure (not "not enough evidence")
    many, _ = yolo_output(objects=6, batch=13)
    gone = many.copy()
    gone[:10, 4:, 0:3] = 0.01
    found = compare(run_with(gone), cases_of(many), adapter=adapter, gates=Gates(adapter), precision="int8")
    recall = next(c for c in found.checks if c.key == "task recall")
    assert recall.name == "task recall" and not recall.passed and recall.interval[1] < 0.95, (recall.name, recall.interval)


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
                    gates=Gates(adapter, Tolerances.parse(["conf=0.05", "min_detections=0"])), precision="fp16")
    assert found.passed and found.task["conf"] == 0.05 and found.task["reference_detections"] > 0


def test_random_cases_gate_parity_but_not_the_task():
    ref, _ = yolo_output()
    adapter = yolo_adapter()
    found = compare(run_with(ref.copy()), cases_of(ref, "random"), adapter=adapter, gates=Gates(adapter),
                    precision="fp16")
    assert [c.name for c in found.checks if not c.passed] == ["task: no photographs compared"]


def _near_threshold(score: float, batch: int = 4):
    """Reference outputs (``batch`` images of 6 objects) whose object 0 of image 0 scores ``score``."""
    ref, _ = yolo_output(batch=batch)
    ref[0, 4:, 0:3] = 0.001
    ref[0, 4, 0:3] = [score, score - 0.05, score - 0.1]  # its best anchor scores ``score``
    return ref


@pytest.mark.parametrize("moved, margin, lost", [(0.015, 0.02, False), (0.015, 0.0, True), (0.05, 0.02, True)])
def test_detection_conf_margin_tells_a_threshold_flip_from_a_loss(moved, margin, lost):
    """A detection 0.01 above conf 0.25 that drops by ``moved``: when it lands within the margin below conf
    it is a threshold flip (neither lost nor counted against recall), further below a loss; margin 0 is
    the plain rule. The same for a detection the candidate adds."""
    ref = _near_threshold(0.26)
    cand = ref.copy()
    cand[0, 4, 0:3] -= moved
    adapter = yolo_adapter()
    gates = Gates(adapter, Tolerances.parse([f"conf_margin={margin}"]))
    found = compare(run_with(cand), cases_of(ref), adapter=adapter, gates=gates, precision="int8")
    assert found.task["reference_detections"] == 24
    assert found.task["recall"] == pytest.approx(23 / 24 if lost else 1.0)
    assert found.task.get("threshold_flips", 0.0) == (0.0 if lost or not margin else 1.0)
    # the other way round: a candidate detection 0.01 above conf that the reference scores ``moved`` lower
    up_ref = _near_threshold(0.26 - moved)
    up = up_ref.copy()
    up[0, 4, 0:3] += moved
    found = compare(run_with(up), cases_of(up_ref), adapter=adapter, gates=gates, precision="int8")
    assert found.task["precision"] == pytest.approx(23 / 24 if lost else 1.0)


def test_binomial_minimum_of_the_share_gates():
    """Too few detections to judge an x% rule: fewer than 1 / (p (1 - p)), p = 1 - limit."""
    from enginekit.compare.comparison import binomial_minimum

    assert binomial_minimum(0.95) == 22  # the 5% rule: 1 / 0.0475 = 21.05
    assert binomial_minimum(0.9) == 12 and binomial_minimum(0.99) == 102
    assert binomial_minimum(1.0) == 0 and binomial_minimum(0.0) == 0  # no rate to judge


def test_too_few_detections_is_not_enough_evidence_and_asks_for_images():
    """6 detections (one image): a perfect INT8 candidate does not pass on them, and a candidate that lost one
    does not fail on that flip alone: the share gates' exact 95% intervals straddle their limits, so both are 'not
    enough evidence', naming the remedy. 78 detections decide; FP32 keeps the plain count; a minimum the user sets
    (min_detections) asks for the older rule: point figures on at least that many."""
    adapter = yolo_adapter()
    ref, _ = yolo_output(batch=1)
    for precision in ("fp16", "int8"):
        found = compare(run_with(ref.copy()), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision=precision)
        assert not found.passed and found.task["recall"] == 1.0
        failed = {c.key: c for c in found.checks if not c.passed}
        assert set(failed) == {"task recall", "task precision"}, list(failed)
        recall = failed["task recall"]
        assert recall.name.startswith("task recall: not enough evidence: recall 1 is between 0.541 and 1.000 on 6 "
                                      "detection(s) of 1 image(s)"), recall.name
        assert "--images" in recall.name and "--image-count 12" in recall.name, recall.name  # 72 / 6 per image
        assert recall.interval == [pytest.approx(0.540742, abs=1e-6), 1.0]  # 0.025 ** (1 / 6)
    lost = ref.copy()
    lost[0, 4:, 0:3] = 0.001
    found = compare(run_with(lost), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="int8")
    assert any(c.name.startswith("task recall: not enough evidence") for c in found.checks if not c.passed)
    # build parity (require_task=False) says so in a note
    found = compare(run_with(ref.copy()), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="int8",
                    require_task=False)
    assert found.passed and any("not enough evidence" in n for n in found.notes)
    # FP32: PyTorch's scores to ~1e-6, a flip is a fault whatever the count
    assert compare(run_with(ref.copy()), cases_of(ref), adapter=adapter, gates=Gates(adapter), precision="fp32").passed
    # enough detections, limits a perfect share of 6 clears, or the older rule asked for
    many, _ = yolo_output(batch=13)
    assert compare(run_with(many.copy()), cases_of(many), adapter=adapter, gates=Gates(adapter), precision="int8").passed
    for tol in (["min_detections=0"], ["int8.min_detections=6"], ["recall=0.5", "precision=0.5"]):
        found = compare(run_with(ref.copy()), cases_of(ref), adapter=adapter, gates=Gates(adapter, tol),
                        precision="int8")
        assert found.passed, (tol, found.failures())
    found = compare(run_with(ref.copy()), cases_of(ref), adapter=adapter, gates=Gates(adapter, ["min_detections=22"]),
                    precision="int8")
    (failed,) = [c for c in found.checks if not c.passed]
    assert failed.name.startswith("task: not enough evidence: 6 reference detections") and "--image-count 4" in failed.name
    with pytest.raises(UsageError, match="min_detections"):
        Gates(adapter, ["min_detections=-1"])


def test_int8_parity_is_judged_on_photographs_and_noise_only_for_structure():
    """A calibrated graph is out of range on noise: its random cases gate only finite outputs (their figures
    kept in the report); an FP16 graph's random cases gate parity as before; INT8 with no photograph fails."""
    adapter = yolo_adapter()
    ref, logits = yolo_output(batch=13)
    noisy = ref.copy()
    noisy[:, 4:] = _sigmoid(logits + 3.0)  # far off on every anchor
    cases = cases_of(ref) + [Case("random", "random", {"images": np.full((1,), 13, np.float32)}, {"output0": ref[:1]})]
    cand = np.concatenate([ref, noisy[:1]])
    found = compare(run_with(cand), cases, adapter=adapter, gates=Gates(adapter), precision="int8")
    assert found.passed, found.failures()
    assert found.structure["scores"]["rel_l2"] > 0.5 and found.worst["scores"]["rel_l2"] == 0.0
    assert found.cases[-1]["gated"] == "finite only" and any("random inputs" in n for n in found.notes)
    assert not compare(run_with(cand), cases, adapter=adapter, gates=Gates(adapter), precision="fp16").passed
    cand[13, 5, 3] = np.nan
    found = compare(run_with(cand), cases, adapter=adapter, gates=Gates(adapter), precision="int8")
    assert [c.name for c in found.checks if not c.passed] == ["parity scores finite (random inputs)"]
    found = compare(run_with(cand), cases[-1:], adapter=adapter, gates=Gates(adapter), precision="int8",
                    require_task=False)
    assert any(c.name.startswith("parity: no photographs compared") for c in found.checks if not c.passed)


def test_overrides_by_part_precision_and_option():
    adapter = yolo_adapter()
    gates = Gates(adapter, Tolerances.parse(["scores.max_abs=0.5", "fp16.rel_l2=0.1", "int8.map50=0.7", "conf=0.1"]))
    assert gates.parity("fp16", "scores").max_abs == 0.5
    assert gates.parity("fp16", "boxes").rel_l2 == 0.1 and gates.parity("int8", "boxes").rel_l2 != 0.1
    assert gates.task("int8")["map50"] == (">=", 0.7) and gates.task("fp16")["map50"] == (">=", 0.9)
    assert gates.options("fp16") == {"conf": 0.1, "conf_margin": None}  # None: the band measured
    # the most specific limit wins whatever the order; of two equal ones, the later
    gates = Gates(adapter, ["fp16.scores.rel_l2=0.3", "scores.rel_l2=0.2", "fp16.rel_l2=0.1", "rel_l2=0.05",
                            "rel_l2=0.04"])
    assert gates.parity("fp16", "scores").rel_l2 == 0.3 and gates.parity("int8", "scores").rel_l2 == 0.2
    assert gates.parity("fp16", "boxes").rel_l2 == 0.1 and gates.parity("int8", "boxes").rel_l2 == 0.04
    with pytest.raises(UsageError, match="unknown tolerance 'boxes2.rel_l2' for yolo"):
        Gates(adapter, {"boxes2.rel_l2": 0.5})
    with pytest.raises(UsageError, match="unknown tolerance 'rel_2'"):
        Gates(adapter, {"rel_2": 0.5})
    with pytest.raises(UsageError, match="unknown tolerance 'abs_rel' for yolo"):  # depth's, not a detector's
        Gates(adapter, ["abs_rel=0.1"])


def test_depth_nothing_to_compare_fails():
    from enginekit.families import resolve

    adapter = resolve("depth")
    ref = np.zeros((1, 28, 28), dtype=np.float32)
    cases = [Case("photo", "photo", {"pixel_values": np.zeros(1)}, {"depth": ref})]
    found = compare(lambda feed: {"depth": ref}, cases, adapter=adapter, gates=Gates(adapter), precision="fp16")
    assert not found.passed and any("nothing to compare" in c.name for c in found.checks)


def test_the_worst_case_is_taken_the_way_each_statistic_gets_worse():
    """Of two cases, the gate sees the larger error and the smaller cosine, whichever case has them;
    a candidate with NaN fails every parity check of its part."""
    adapter = yolo_adapter()
    ref, _ = yolo_output()
    cand = ref.copy()
    cand[0, 0:4] += 3.0  # case 0: the boxes shifted (larger error)
    cand[1, 0:4] *= -1.0  # case 1: the boxes mirrored (cosine -1)
    found = compare(run_with(cand), cases_of(ref, "random"), adapter=adapter, gates=Gates(adapter), precision="fp16",
                    require_task=False)
    per_case = [{o["part"]: o for o in c["outputs"]}["boxes"] for c in found.cases]
    worst = found.worst["boxes"]
    assert worst["rel_l2"] == max(c["rel_l2"] for c in per_case) == per_case[1]["rel_l2"]
    assert worst["cosine"] == min(c["cosine"] for c in per_case) == pytest.approx(-1.0)
    assert worst["max_abs"] == max(c["max_abs"] for c in per_case)
    failed = {c.name for c in found.checks if not c.passed}
    assert {"parity boxes rel_l2", "parity boxes cosine"} <= failed and not any("scores" in n for n in failed)
    cand[1, 5, 7] = np.nan
    found = compare(run_with(cand), cases_of(ref, "random"), adapter=adapter, gates=Gates(adapter), precision="fp16",
                    require_task=False)
    assert {"parity scores finite", "parity scores rel_l2", "parity scores cosine", "parity scores max_abs"} <= {
        c.name for c in found.checks if not c.passed}


def test_task_gates_go_the_way_the_statistics_table_says():
    """Every family's task gate is a minimum where the metric is a share (recall, mAP, delta1) and a
    maximum where it is an error (AbsRel): the family and the statistics table agree."""
    from enginekit.compare.metrics import STATISTICS
    from enginekit.families import registered

    for cls in registered():
        for precision, gates in cls.task_gates.items():
            for metric, (op, limit) in gates.items():
                assert metric not in STATISTICS or STATISTICS[metric].op == op, (cls.__name__, precision, metric)
                assert STATISTICS[metric].limit_problem(limit) is None if metric in STATISTICS else True
        for option, default in cls.task_options.items():
            if default is not None:  # None: measured (conf_margin's band)
                assert option not in STATISTICS or STATISTICS[option].limit_problem(default) is None, (cls, option)


def test_simplify_refuses_a_graph_that_computes_otherwise(tmp_path, monkeypatch):
    """Simplify's own check is the one comparison: a simplified graph whose second output drifts by 1e-3
    (rel L2) is refused and nothing is written; an equal one passes."""
    import onnx
    import onnxsim
    from onnx import TensorProto, helper, numpy_helper

    from enginekit.errors import ParityError
    from enginekit.stages.simplify import simplify_onnx

    def graph(scale: float):
        nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Mul", ["x", "k"], ["z"])]
        k = numpy_helper.from_array(np.array(scale, np.float32), "k")
        dims = ["N", 3, 8, 6]  # a non-square input, any batch
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in "yz"], [k])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])

    src = tmp_path / "m.onnx"
    onnx.save(graph(2.0), str(src))
    monkeypatch.setattr(onnxsim, "simplify", lambda model, **kw: (graph(2.002), True))
    with pytest.raises(ParityError, match=r"rel L2 1\.00e-03 > 1e-05"):
        simplify_onnx(src, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists() and not list(tmp_path.glob(".out*"))
    monkeypatch.setattr(onnxsim, "simplify", lambda model, **kw: (graph(2.0), True))
    report = simplify_onnx(src, tmp_path / "out.onnx")
    assert report.max_rel_l2 == 0.0 and report.checked_shapes == [(1, 3, 8, 6), (2, 3, 8, 6)]


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


# --- on the detector the suite trains (tests/trained_detector.py) ----------------------------------------

TRAINED_SHAPE = "1x3x320x320"


@pytest.fixture(scope="module")
def trained(trained_detector, tmp_path_factory):
    """The trained detector's checkpoint, its FP32 and FP16 ONNX at 320, and held-out images of shapes."""
    from trained_detector import write_held_out_images

    from enginekit import api
    from enginekit.cache import Cache

    root = tmp_path_factory.mktemp("trained")
    # 14 images, about 90 reference detections: enough for a share's 95% interval to clear the 5% rule (72)
    images = write_held_out_images(root / "images", count=14, size=320)
    cache = Cache(root / "cache")
    fp32 = api.export(trained_detector.model, weights=trained_detector.weights, input=TRAINED_SHAPE,
                      output=root / "fp32.onnx", images=images, cache=cache, quiet=True)
    fp16 = api.export(trained_detector.model, weights=trained_detector.weights, input=TRAINED_SHAPE, fp16=True,
                      output=root / "fp16.onnx", images=images, cache=cache, quiet=True)
    assert fp32.passed and fp16.passed, fp32.failures() + fp16.failures()
    return {"weights": trained_detector.weights, "model": trained_detector.model, "images": images,
            "fp32": fp32.output, "fp16": fp16.output, "root": root}


def _verify(trained, onnx_path, tmp_path, **kw):
    from enginekit import api
    from enginekit.cache import Cache

    return api.verify(str(onnx_path), reference=trained["weights"], images=trained["images"], image_count=14,
                      cache=Cache(trained["root"] / "cache"), quiet=True, report_dir=tmp_path / "report", **kw)


def test_trained_reference_has_something_to_compare(trained, tmp_path):
    """Before any gate on it is trusted: the FP32 reference detects shapes, with scores that spread."""
    from enginekit.families import resolve

    decode = resolve(trained["model"]).decode  # the detections the task metrics compare
    scores = np.concatenate([decode({"output0": out}, {}, 0.001)[0].scores for out in _reference_outputs(trained)])
    assert scores.max() > 0.7 and np.std(scores) > 0.1 and (scores < 0.25).sum() > 0
    outcome = _verify(trained, trained["fp32"], tmp_path)
    (report,) = outcome.reports
    assert outcome.passed, [str(c) for c in report.failures()]
    assert report.artifacts[0].task["reference_detections"] >= 16  # about 3 shapes per image at conf 0.25


def _reference_outputs(trained) -> list[np.ndarray]:
    """PyTorch outputs of the trained detector on the held-out images."""
    from enginekit.families import resolve
    from enginekit.images import load_images

    adapter = resolve(trained["model"])
    loaded = adapter.load(trained["weights"], random_init=False, seed=0)
    return [adapter.reference(loaded, adapter.preprocess(img, (320, 320)))["output0"]
            for img in load_images(trained["images"]).images]


def test_honest_fp16_passes_with_figures_that_are_not_trivial(trained, tmp_path):
    outcome = _verify(trained, trained["fp16"], tmp_path)
    (report,) = outcome.reports
    (art,) = report.artifacts
    assert outcome.passed, [str(c) for c in report.failures()]
    assert art.precision == "fp16"
    assert art.task["reference_detections"] >= 16 and art.task["recall"] >= 0.95
    assert 0 < art.task["score_shift_max"] < 0.02  # FP16 moves the scores, a little
    assert 0 < art.parts["scores"]["worst"]["max_abs"] and 0 < art.parts["boxes"]["worst"]["max_abs"]
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "| scores: output0[axis 1: 4:] (probabilities)" in summary and "map50_95" in summary


def perturb_class_scores(src, dst, delta=-1.0):
    """Subtract 1 from the bias of the class branch's last convolution (Detect cv3.*.2) at every scale."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    biases = [n.input[2] for n in model.graph.node
              if n.op_type == "Conv" and len(n.input) > 2 and "cv3" in n.name and n.name.split("/")[-2].endswith(".2")]
    assert len(biases) == 3, [n.name for n in model.graph.node if "cv3" in n.name]
    for name in biases:
        arr = numpy_helper.to_array(inits[name]).copy() + delta
        inits[name].CopyFrom(numpy_helper.from_array(arr.astype(np.float32), name))
    onnx.save(model, str(dst))
    return dst


def wrong_normalisation(src, dst, kind: str):
    """A graph fed differently than the model was trained: 0-255 pixels, or ImageNet mean/std."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    first = graph.input[0].name
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == first:
                node.input[i] = "renormalised"
    if kind == "0-255":
        graph.initializer.append(numpy_helper.from_array(np.array(255.0, dtype=np.float32), "wrong_scale"))
        graph.node.insert(0, helper.make_node("Mul", [first, "wrong_scale"], ["renormalised"]))
    else:
        mean = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1)
        std = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1)
        graph.initializer.extend([numpy_helper.from_array(mean, "wrong_mean"), numpy_helper.from_array(std, "wrong_std")])
        graph.node.insert(0, helper.make_node("Sub", [first, "wrong_mean"], ["centred"]))
        graph.node.insert(1, helper.make_node("Div", ["centred", "wrong_std"], ["renormalised"]))
    onnx.save(model, str(dst))
    return dst


def test_class_score_shift_fails_naming_scores(trained, tmp_path, run_cli):
    bad = perturb_class_scores(trained["fp32"], tmp_path / "scores-1.onnx")
    r = run_cli("verify", str(bad), "--reference", str(trained["weights"]), "--images", str(trained["images"]),
                "--image-count", "8", "--report", "rep", env={"ENGINEKIT_CACHE": str(trained["root"] / "cache")})
    from conftest import assert_one_line_error

    line = assert_one_line_error(r, 1)
    assert "scores" in line or "task" in line, line
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    failures = data["entries"][0]["failures"]
    assert any("parity scores" in f for f in failures) and not any("parity boxes" in f for f in failures)
    assert any("task recall" in f for f in failures)


@pytest.mark.parametrize("kind", ["0-255", "imagenet"])
def test_wrong_normalisation_fails(trained, tmp_path, kind):
    bad = wrong_normalisation(trained["fp32"], tmp_path / f"wrong-{kind}.onnx", kind)
    outcome = _verify(trained, bad, tmp_path)
    (report,) = outcome.reports
    assert not outcome.passed
    failed = {c.name for c in report.failures()}
    assert {"parity boxes rel_l2", "parity scores rel_l2", "task map50"} <= failed, failed
    assert {"task recall", "task precision"} & failed, failed  # 0-255: both; ImageNet: extra detections


def test_broken_image_is_skipped_and_reported(run_cli, tmp_path, trained):
    import shutil

    photos = tmp_path / "photos"
    shutil.copytree(trained["images"], photos)
    (photos / "broken.jpg").write_bytes(b"not a jpeg")
    r = run_cli("verify", str(trained["fp16"]), "--reference", str(trained["weights"]), "--images", "photos",
                "--image-count", "15", env={"ENGINEKIT_CACHE": str(trained["root"] / "cache")})
    assert r.code == 0, r.stderr
    assert "skipped images" in r.stderr and "broken.jpg" in r.stderr


# --- INT8 on the trained detector: the default passes, a lossy graph exits 1 -----------------------------

def _verify_int8(trained, tmp_path, **build):
    from enginekit import api
    from enginekit.cache import Cache

    options = {"profiles": [TRAINED_SHAPE], "weights": trained["weights"], **build}
    return api.verify(trained["model"], precision="int8", build_options=options, images=trained["images"],
                      image_count=14, cache=Cache(trained["root"] / "cache"), quiet=True,
                      report_dir=tmp_path / "report")


def _int8_artifact(outcome):
    (report,) = outcome.reports
    return report, next(a for a in report.artifacts if a.precision == "int8" and a.task)


def test_default_int8_passes_with_figures_that_are_not_trivial(trained, tmp_path):
    """YOLO's default calibration (max, on the embedded photographs) keeps the FP32 detections."""
    outcome = _verify_int8(trained, tmp_path)
    report, art = _int8_artifact(outcome)
    assert outcome.passed, [str(c) for c in report.failures()]
    assert art.task["reference_detections"] >= 16 and art.task["recall"] >= 0.95
    assert art.parts["scores"]["worst"]["rel_l2"] > 1e-3  # INT8 moved the scores: the gate compared something
    methods = {json.loads(m.read_text()).get("method") for m in (trained["root"] / "cache").glob("onnx-int8/*/manifest.json")}
    assert "max" in methods, f"YOLO's default calibration is max, found {methods}"


def test_lossy_int8_exits_1_naming_what_it_lost(trained, tmp_path, run_cli):
    """Calibrated on data unlike what the detector sees (noise), INT8 adds false detections: exit 1."""
    noise = tmp_path / "noise.npy"
    np.save(noise, np.random.default_rng(0).random((8, 3, 320, 320), dtype=np.float32))
    r = run_cli("verify", trained["model"], "--weights", str(trained["weights"]), "--precision", "int8",
                "--profile", TRAINED_SHAPE, "--calib-data", str(noise), "--images", str(trained["images"]),
                "--image-count", "8", "--report", "rep", env={"ENGINEKIT_CACHE": str(trained["root"] / "cache")})
    from conftest import assert_one_line_error

    line = assert_one_line_error(r, 1)
    assert "task" in line or "scores" in line, line
    failures = json.loads((tmp_path / "rep" / "report.json").read_text())["entries"][0]["failures"]
    assert any("task precision" in f for f in failures), failures
    assert any("parity scores" in f for f in failures), failures


def scale_largest_weight(src, dst, share: float = 0.1, factor: float = -3.0):
    """A tenth of the largest weight tensor multiplied by -3. On a random-weight yolo12n this left every
    parity figure as it was (boxes rel L2 2.4e-8, scores 5.3e-4: its outputs hardly depend on its weights);
    the comparison now says such a reference compares nothing (tests/test_comparison_guard.py)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    floats = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    largest = max(floats, key=lambda i: int(np.prod(i.dims)))
    arr = numpy_helper.to_array(largest).copy()
    flat = arr.reshape(-1)
    flat[: max(1, int(share * flat.size))] *= factor
    largest.CopyFrom(numpy_helper.from_array(arr, largest.name))
    onnx.save(model, str(dst))
    return dst


def test_a_tampered_weight_tensor_fails_parity(trained, tmp_path):
    """The tamper that a random-weight YOLO could not show: on the trained detector, it fails its parity."""
    bad = scale_largest_weight(trained["fp32"], tmp_path / "tampered.onnx")
    outcome = _verify(trained, bad, tmp_path)
    (report,) = outcome.reports
    assert not outcome.passed
    failed = {c.name for c in report.failures()}
    assert {"parity boxes rel_l2", "parity scores rel_l2"} & failed, failed
    assert not any("nothing to compare" in name for name in failed)  # the reference depends on its input
    assert not report.artifacts[0].parts["boxes"].get("constant") and not report.artifacts[0].parts["scores"].get("constant")


def test_the_band_near_the_threshold_is_measured_from_the_score_shifts():
    """A candidate whose scores all move by about 0.01 (as INT8's do): a reference detection 0.004 over conf that lands
    0.004 under it is a threshold flip by default (the band measured from the shifts: left out of recall's count),
    lost with the plain rule (conf_margin=0); a detection that falls from 0.9 to under conf is lost either way."""
    adapter = yolo_adapter()
    ref, logits = yolo_output(batch=13)
    rng = np.random.default_rng(3)
    moved = _sigmoid(logits + rng.choice([-1.0, 1.0], logits.shape) * 0.06).astype(np.float32)  # ~0.01 at 0.5
    near = ref.copy()
    near[0, 4:, 0:3] = 0.001
    near[0, 4, 0:3] = [0.254, 0.2, 0.15]  # object 0 of image 0 just over conf 0.25
    cand = near.copy()
    cand[1:, 4:] = moved[1:]
    cand[0, 4, 0:3] = [0.246, 0.2, 0.15]  # ... just under it
    found = compare(run_with(cand), cases_of(near), adapter=adapter, gates=Gates(adapter), precision="int8")
    band = found.task["conf_margin"]
    assert found.task["conf_margin_measured"] == 1.0 and 0.004 < band <= 0.05, found.task
    assert found.task["threshold_flips"] >= 1 and found.task["recall"] == 1.0, found.task
    assert found.task["decided_reference"] == found.task["reference_detections"] - 1
    plain = compare(run_with(cand), cases_of(near), adapter=adapter, gates=Gates(adapter, ["conf_margin=0"]),
                    precision="int8")
    assert plain.task["recall"] < 1.0 and "threshold_flips" not in plain.task
    fell = cand.copy()
    fell[1, 4:, 15:18] = 0.2  # object 5 of image 1 (0.95) falls under conf: no flip, however the scores move
    found = compare(run_with(fell), cases_of(near), adapter=adapter, gates=Gates(adapter), precision="int8")
    assert found.task["recall"] < 1.0 and found.task["decided_reference"] == found.task["reference_detections"] - 1
