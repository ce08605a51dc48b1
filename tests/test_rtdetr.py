"""RT-DETR (rtdetr-l): registered, keyed by its --random-init, verified FP32 and FP16, and its gate
fails on a perturbed graph.

``--random-init`` of this family is a smooth detector (families/ultralytics/rtdetr.py, _separate_rtdetr):
its references detect ~20 things per photograph at conf 0.25, so every task check compares real
detections. Graphs are exported at 320 px to keep the time down.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import assert_one_line_error
from enginekit.compare.comparison import Case, Gates, compare
from enginekit.families import families, resolve

PROFILE = "1x3x320x320"


def test_rtdetr_is_registered_listed_and_keyed_by_its_init(run_cli):
    from enginekit.families.ultralytics.rtdetr import RtdetrAdapter
    from enginekit.pipeline import ModelRequest

    assert type(resolve("rtdetr-l")) is RtdetrAdapter and resolve("RTDETR-X").variant == "rtdetr-x"
    (row,) = [f for f in families() if f.family == "rtdetr"]
    assert "rtdetr-l" in row.variants and row.task == "detect"
    listed = json.loads(run_cli("models", "--json").stdout)
    assert any(f["family"] == "rtdetr" and "rtdetr-l" in f["variants"] for f in listed)
    # the init is part of the weights identity (every cache key), YOLO's informative init too
    assert ModelRequest("rtdetr-l", random_init=True, seed=3).weights_identity == "random:rtdetr-l+separated1@3"
    assert ModelRequest("yolo12n", random_init=True).weights_identity == "random:yolo12n+informative3@0"


def test_rtdetr_nms_is_one_line_error(run_cli):
    result = run_cli("export", "rtdetr-l", "--random-init", "--nms", "--input", PROFILE)
    assert_one_line_error(result, 2, "--nms", "rtdetr-l ends in RT-DETR's decoder")


def test_rtdetr_rows_reordered_by_near_ties_are_paired():
    """Parity compares the rows both graphs hold: two rows swapped compare equal, a moved box does not."""
    adapter = resolve("rtdetr-l")
    rng = np.random.default_rng(0)
    out = np.zeros((1, 300, 6), dtype=np.float32)
    out[0, :, :2] = rng.uniform(0.1, 0.9, (300, 2))
    out[0, :, 2:4] = rng.uniform(0.05, 0.2, (300, 2))
    out[0, :, 4] = np.sort(rng.uniform(0.01, 0.9, 300))[::-1]
    out[0, :, 5] = rng.integers(0, 3, 300)
    swapped = out.copy()
    swapped[0, [10, 11]] = swapped[0, [11, 10]]
    ref, cand = adapter.parity_outputs({"output0": out}, {"output0": swapped}, {"end2end": "True"})
    np.testing.assert_array_equal(ref["output0"], cand["output0"])
    moved = out.copy()
    moved[0, 10, 0] += 0.01
    ref, cand = adapter.parity_outputs({"output0": out}, {"output0": moved}, {"end2end": "True"})
    assert np.abs(ref["output0"] - cand["output0"]).max() == pytest.approx(0.01, abs=1e-6)


@pytest.fixture(scope="module")
def rtdetr_loaded():
    adapter = resolve("rtdetr-l")
    return adapter, adapter.load(None, random_init=True, seed=0)


@pytest.fixture(scope="module")
def rtdetr_onnx(rtdetr_loaded, tmp_path_factory):
    """The FP32 graph at 320 px, exported as the export stage does (no cache)."""
    from enginekit.stages.export import export_onnx

    adapter, loaded = rtdetr_loaded
    return export_onnx(adapter, loaded, (1, 3, 320, 320), tmp_path_factory.mktemp("rtdetr") / "rtdetr-l.onnx")


@pytest.mark.slow
def test_rtdetr_random_init_is_deterministic_and_detects(rtdetr_loaded):
    import torch

    from enginekit.images import load_images

    adapter, loaded = rtdetr_loaded
    assert loaded.weights.identity == "random:rtdetr-l.yaml+separated1@0"
    photos = np.concatenate([adapter.preprocess(i, (320, 320)) for i in load_images(None, limit=4).images])
    out = adapter.reference(loaded, photos)["output0"]
    detected = (out[..., 4] >= 0.25).sum(1)
    assert (detected >= 5).all() and (detected <= 100).all(), detected  # real detections, not every query
    again = resolve("rtdetr-l").load(None, random_init=True, seed=0)
    for a, b in zip(loaded.module.state_dict().values(), again.module.state_dict().values()):
        if torch.is_floating_point(a):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
def test_rtdetr_perturbed_box_heads_fail_the_task_gate(rtdetr_loaded, rtdetr_onnx, tmp_path):
    """Every decoder layer's box head with its last weights negated: boxes move, the gate fails."""
    from test_tasks import _negate_weights, perturb_graph

    from enginekit.images import load_images
    from enginekit.onnx import runtime

    adapter, loaded = rtdetr_loaded
    path = rtdetr_onnx
    cases = []
    for i, image in enumerate(load_images(None, limit=4).images):
        feed = {adapter.input_name: adapter.preprocess(image, (320, 320))}
        cases.append(Case(f"photo {i}", "photo", feed, adapter.reference(loaded, feed[adapter.input_name])))

    def gate(onnx_path):
        sess = runtime.session(onnx_path)
        return compare(lambda feed: runtime.run(sess, feed), cases, adapter=adapter, gates=Gates(adapter, {}),
                       precision="fp32", metadata=loaded.metadata, name="rtdetr-l")

    good = gate(path)
    assert good.passed, (good.failures(), good.task)
    assert good.task["compared"] >= 20 and good.task["recall"] == 1.0
    perturb_graph(path, tmp_path / "bad.onnx", r"/model\.\d+/decoder/dec_bbox_head\.\d+/layers\.2/MatMul",
                  _negate_weights)
    bad = gate(tmp_path / "bad.onnx")
    failed = {c.name for c in bad.checks if not c.passed}
    assert {"task map50", "task precision"} <= failed, (failed, bad.task)
    assert bad.task["compared"] == good.task["compared"]  # the same reference detections, found elsewhere


@pytest.mark.slow
def test_rtdetr_verify_fp16_passes_comparing_detections(cache, tmp_path):
    """One FP16 verify checks the FP32 graph (simplified) and the FP16 one, each on its detections."""
    from enginekit import api

    outcome = api.verify("rtdetr-l", precision="fp16", cache=cache, quiet=True, report_dir=tmp_path / "report",
                         build_options={"profiles": [PROFILE], "random_init": True})
    (report,) = outcome.reports
    assert outcome.passed, [str(c) for c in report.failures()]
    assert [a.name for a in report.artifacts] == ["onnx-export", "onnx-simplify", "onnx-fp16", "engine"]
    for graph in report.artifacts[1:3]:
        assert graph.task["compared"] >= 20 and graph.task["recall"] >= 0.95, graph.task
        assert set(graph.parts) == {"boxes", "scores", "classes"}
    assert report.artifacts[1].task["recall"] == 1.0 and report.artifacts[1].task["precision"] == 1.0
    for graph in report.artifacts[:3]:  # its detections drawn over the photograph, one picture per graph
        assert [p.endswith(f"{graph.name}-detections.png") for p in graph.pictures] == [True], graph.pictures


@pytest.mark.slow
def test_rtdetr_runtime_matches_ultralytics_rtdetr_predict(rtdetr_loaded, rtdetr_onnx, tmp_path):
    """load() on the FP32 graph (ONNX Runtime CPU) == Ultralytics' RTDETR(weights).predict, on photographs
    that are not square (the stretch to 320x320 is undone per axis)."""
    from test_runtime_tasks import _box_iou
    from ultralytics import RTDETR

    import enginekit
    from enginekit.images import embedded_image_paths

    adapter, loaded = rtdetr_loaded
    weights = tmp_path / "rtdetr-l.pt"
    adapter.save_checkpoint(loaded, weights)
    predictor = enginekit.load(str(rtdetr_onnx), backend="onnxruntime-cpu")
    assert predictor.family == "rtdetr"
    model = RTDETR(str(weights))
    compared = 0
    for image in [p for p in embedded_image_paths() if p.name in ("bus.jpg", "zidane.jpg")]:
        ref = model.predict(str(image), imgsz=320, conf=0.25, verbose=False, device="cpu")[0].boxes
        ours = predictor(image)
        assert ours.image_shape == tuple(ref.orig_shape) and ours.image_shape[0] != ours.image_shape[1]
        bgr = __import__("cv2").imread(str(image))  # the input: RTDETRPredictor's stretch, bit for bit, on the host
        want = model.predictor.preprocess([bgr]).numpy()  # path and the GPU path (device steps on the CPU)
        assert np.array_equal(predictor.preprocess_cpu([bgr], (320, 320)), want)
        assert np.array_equal(predictor.device_input([bgr], (320, 320), device="cpu").numpy(), want)
        ref_boxes, ref_cls = ref.xyxy.numpy(), ref.cls.numpy().astype(int)
        assert len(ours) == len(ref)
        # one query may be kept with two classes (the same box twice): match within a class
        iou = _box_iou(ours.boxes, ref_boxes) * (ours.class_ids[:, None] == ref_cls[None])
        j = iou.argmax(1)
        assert len(set(j.tolist())) == len(j) and iou.max(1).min() >= 0.99, iou.max(1)
        assert np.abs(ours.scores - ref.conf.numpy()[j]).max() <= 1e-3
        assert ours.boxes[:, [0, 2]].max() > 320 or ours.boxes[:, [1, 3]].max() > 320  # in the original's pixels
        compared += len(ref)
    assert compared >= 10
