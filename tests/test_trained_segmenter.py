"""The VR pipeline's model kind, trained: a DeepLabV3-family segmenter (tests/trained_segmenter.py) through
``verify --data`` with mask labels, as a user runs it.

The segmenter learned the shapes (held-out, non-square composites score mIoU >= 0.8), so its class maps mean
something and a gate on them can fail: FP16 and INT8 (calibrated on composites neither training nor the check
saw) keep mIoU against the masks within their limits; the same graph with two classes' weights exchanged in
the classifier fails, named by parity and by the labels' mIoU drop. benchmarks/trained_segmenter.md has the
figures of both calibration methods and of a second tamper.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import trained_segmenter as ts


@pytest.fixture(scope="module")
def seg(tmp_path_factory):
    from enginekit.cache import Cache

    root = tmp_path_factory.mktemp("trained-segmenter")
    return {"weights": ts.trained(), "check": ts.write_split(root / "check", ts.CHECK),
            "calib": ts.write_split(root / "calib", ts.CALIB, masks=False), "cache": Cache(root / "cache")}


def _declared(seg, **more):
    return {"weights": seg["weights"], "declared": {"classes": len(ts.NAMES), "size": "x".join(map(str, ts.SIZE))},
            **more}


def test_the_segmenter_learned_the_shapes(seg):
    """Held-out composites (256x352, seeds training never drew): the gates below judge a model that works."""
    assert ts.held_out_miou(seg["weights"], seg["check"]) >= 0.8


def test_fp16_and_int8_keep_the_class_maps_against_the_masks(seg, tmp_path):
    from enginekit import api

    check = seg["check"]
    outcome = api.verify(ts.MODEL, precision="fp16,int8", data=check / "data.yaml", images=check / "images" / "val",
                         cache=seg["cache"], quiet=True, report_dir=tmp_path / "report",
                         build_options=_declared(seg, calib_data=seg["calib"] / "images" / "val", calib_count=16))
    failures = [str(c) for r in outcome.reports for c in r.failures()]
    assert outcome.passed, failures
    graphs = {a.precision: a for r in outcome.reports for a in r.artifacts if a.kind.startswith("onnx") and a.ran}
    assert {"fp16", "int8"} <= set(graphs), sorted(graphs)
    for precision, limit in (("fp16", 0.01), ("int8", 0.03)):
        art = graphs[precision]
        assert art.ground_truth["reference"]["miou"] >= 0.8, art.ground_truth  # the labels score the FP32 model
        (drop,) = [c for c in art.checks if c.name == "labels miou drop"]
        assert drop.passed and drop.limit == limit and drop.value <= limit, drop  # below 0: the graph scored higher
    # INT8 moved the logits (the gate compared something) and quantized all but a tenth of the convolutions
    assert graphs["int8"].parts["out"]["worst"]["rel_l2"] > 1e-3, graphs["int8"].parts
    (path,) = seg["cache"].root.glob("onnx-int8/*/model.onnx")
    graph = onnx.load(str(path)).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    kept_fp32 = [n.name for n in convs if n.input[0] not in dequantized]
    assert len(convs) > 50 and len(kept_fp32) <= 0.1 * len(convs), kept_fp32
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["passed"] is True


def _swap_classes(src, dst, a: int = 1, b: int = 2) -> list[str]:
    """Classes ``a`` and ``b`` exchanged in every classifier conv (weights and biases of NAMES-sized outputs)."""
    model = onnx.load(str(src))
    swapped = []
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.ndim in (1, 4) and arr.shape[0] == len(ts.NAMES) and init.data_type == onnx.TensorProto.FLOAT:
            arr = arr.copy()
            arr[[a, b]] = arr[[b, a]]
            init.CopyFrom(numpy_helper.from_array(arr, init.name))
            swapped.append(init.name)
    onnx.save(model, str(dst))
    return swapped


def test_a_graph_with_two_classes_exchanged_fails(seg, run_cli, tmp_path):
    from enginekit import api

    exported = api.export(ts.MODEL, output=tmp_path / "seg.onnx", cache=seg["cache"], quiet=True,
                          **_declared(seg))
    assert exported.passed, exported.failures()
    swapped = _swap_classes(exported.output, tmp_path / "swapped.onnx")
    assert len(swapped) == 4, swapped  # the low and high classifiers' weights and biases
    check = seg["check"]
    r = run_cli("verify", "swapped.onnx", "--reference", str(seg["weights"]), "--classes", "4", "--size", "256x256",
                "--data", str(check / "data.yaml"), "--image-count", "8", "--report", "rep")
    assert r.code == 1, (r.stdout, r.stderr)
    entry = json.loads((tmp_path / "rep" / "report.json").read_text())["entries"][0]
    gt = entry["artifacts"][-1]["ground_truth"]
    assert gt["reference"]["miou"] >= 0.8 and gt["miou_drop"] > 0.2, gt
    assert any("labels miou drop" in f for f in entry["failures"]), entry["failures"]
    assert any("parity out rel_l2" in f for f in entry["failures"]), entry["failures"]
    assert np.isfinite(gt["miou"])
