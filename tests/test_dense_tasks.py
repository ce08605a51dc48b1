"""Semantic segmentation and depth (yolo26n-sem, yolo26n-depth) through export, build and verify.

With random weights both heads give one constant map whatever the image (every pixel the same
class; depth within 0.03 % of 1.2 m), so their task gates would have nothing to compare. The
models here are the suite's own (tests/trained_tasks.py): trained with Ultralytics' trainer on
generated shapes, semantic labels the shapes' classes over a background, depth a ground plane
with the shapes standing nearer. On held-out images of that kind the FP32 reference has several
classes and a spread of depths, so mIoU and AbsRel compare something; FP16 and INT8 keep them,
and a graph whose last convolution is negated fails the task gate by name.
"""

from __future__ import annotations

import pytest

from test_gates import _int8_artifact
from test_tasks import _negate_weights, perturb_graph

SHAPE = "1x3x128x128"
# task -> (model, its task metric, the head's last convolution, the metric INT8 calibrated on noise fails)
TASKS = {"semantic": ("yolo26n-sem", "miou", r"/model\.\d+/classifier/classifier\.1/", "miou"),
         "depth": ("yolo26n-depth", "abs_rel", r"/model\.\d+/head/head\.3/", "delta1")}


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """A cache shared by the module; per task held-out images and calibration images (another seed)."""
    from trained_tasks import int8_sets

    return int8_sets(tmp_path_factory.mktemp("dense-tasks"), TASKS, 128)


def _verify(task, data, precision, target=None, report_dir=None, **build):
    from trained_tasks import trained_task_model

    from enginekit import api

    weights = trained_task_model(task)
    if target is not None:  # an ONNX file, checked against its checkpoint
        return api.verify(str(target), reference=weights, images=data["held_out"][task], image_count=8,
                          cache=data["cache"], quiet=True)
    return api.verify(TASKS[task][0], precision=precision, build_options={"profiles": [SHAPE], "weights": weights,
                                                                          **build},
                      images=data["held_out"][task], image_count=8, cache=data["cache"], quiet=True,
                      report_dir=report_dir)


def _artifacts(outcome):
    (report,) = outcome.reports
    return report, {a.name: a for a in report.artifacts if a.task}


def _compared_something(task, art):
    """The FP32 reference holds what a task gate can miss: several classes, or depths that spread."""
    if task == "semantic":
        assert art.task["reference_classes"] >= 3 and art.task["compared"] >= 3, art.task
    else:
        assert art.task["relative_spread"] > 0.1 and art.task["compared"] > 0, art.task


@pytest.mark.slow
@pytest.mark.parametrize("task", list(TASKS))
def test_fp32_and_fp16_graphs_pass_with_a_reference_that_compares_something(task, dense, tmp_path):
    outcome = _verify(task, dense, "fp16", report_dir=tmp_path)
    report, arts = _artifacts(outcome)
    assert outcome.passed, [str(c) for c in report.failures()]
    fp32, fp16 = arts["onnx-simplify"], arts["onnx-fp16"]
    _compared_something(task, fp32)
    metric = TASKS[task][1]
    if task == "semantic":
        assert fp32.task["miou"] > 0.999 and fp16.task["miou"] >= 0.9, (fp32.task, fp16.task)
    else:
        assert fp32.task["abs_rel"] < 1e-4 and fp16.task["abs_rel"] <= 0.05, (fp32.task, fp16.task)
    part = next(iter(fp16.parts.values()))
    assert part["worst"]["rel_l2"] > 1e-5, metric  # FP16 moved the outputs: the gates compared something
    # the report's pictures: class maps and where they differ / the depth error, one per ONNX graph
    suffix = {"semantic": "-classes.png", "depth": "-depth-error.png"}[task]
    for art in (fp32, fp16):
        assert [p.endswith(f"{art.name}{suffix}") for p in art.pictures] == [True], art.pictures
    assert len(list(tmp_path.glob(f"*{suffix}"))) == len([a for a in report.artifacts if a.kind == "onnx" and a.ran])


@pytest.mark.slow
@pytest.mark.parametrize("task", list(TASKS))
def test_int8_calibrated_on_the_domain_passes(task, dense):
    outcome = _verify(task, dense, "int8", calib_data=dense["domain"][task])
    report, art = _int8_artifact(outcome)
    assert outcome.passed, [str(c) for c in report.failures()]
    _compared_something(task, art)
    part = next(iter(art.parts.values()))
    assert part["worst"]["rel_l2"] > 1e-3  # INT8 moved the outputs


@pytest.mark.slow
@pytest.mark.parametrize("task", list(TASKS))
def test_int8_calibrated_on_noise_fails_its_task_gate(task, dense):
    """Semantic: mIoU 0.33 (0.97 calibrated on shapes); depth: delta1 0.945 (0.995), whose AbsRel after the
    scale-and-shift fit stays near the shapes' (figures in families/ultralytics/yolo.py)."""
    outcome = _verify(task, dense, "int8", calib_data=dense["noise"])
    report, art = _int8_artifact(outcome)
    failed = {c.name for c in report.failures()}
    assert not outcome.passed and f"task {TASKS[task][3]}" in failed, (failed, art.task)
    assert {a.name for a in report.artifacts if a.ran and not a.passed} == {"onnx-int8"}  # the FP32 graphs pass


@pytest.mark.slow
@pytest.mark.parametrize("task", list(TASKS))
def test_negated_last_convolution_fails_the_task_gate(task, dense):
    """The head's last convolution negated: the class map picks the least likely class; depth turns inside
    out (near becomes far). The verdict names the task metric."""
    from trained_tasks import trained_task_model

    from enginekit import api

    name, metric, node, _ = TASKS[task]
    path = dense["root"] / f"{name}.onnx"
    exported = api.export(name, weights=trained_task_model(task), input=SHAPE, output=path,
                          images=dense["held_out"][task], cache=dense["cache"], quiet=True)
    assert exported.passed, exported.failures()
    bad = dense["root"] / f"{name}-negated.onnx"
    perturb_graph(path, bad, node, _negate_weights)
    outcome = _verify(task, dense, "fp32", target=bad)
    report, arts = _artifacts(outcome)
    failed = {c.name for c in report.failures()}
    assert not outcome.passed and f"task {metric}" in failed, (failed, [a.task for a in arts.values()])
    (art,) = arts.values()
    _compared_something(task, art)
    if task == "semantic":
        assert art.task["miou"] < 0.5, art.task
    else:
        assert art.task["abs_rel"] > 0.1 and art.task["delta1"] < 0.9, art.task
