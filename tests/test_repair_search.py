"""Repair: a search that finds the few nodes a gate needs wherever they are, INT8 trials as ONNX
edits of the quantized graph, and the repair of the trained detector gated by parity and task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


@pytest.mark.parametrize("needed", [{3}, {0, 57}, {10, 11, 40}])
def test_search_finds_the_needed_nodes_anywhere(needed):
    from enginekit.compare.repair import search

    names = [f"n{i}" for i in range(64)]
    need = {f"n{i}" for i in needed}
    # the ranking is only roughly right: the needed nodes are among the top third, not first
    rng = np.random.default_rng(0)
    ranking = {n: float(rng.uniform(0.0, 1.0)) + (0.5 if n in need else 0.0) for n in names}

    def trial(nodes):
        ok = need <= set(nodes)
        return object(), ok, 0.01 if ok else 0.1

    result = search(trial, names, ranking, max_trials=60)
    assert set(result.nodes) == need, result.nodes  # exactly the needed ones: none near the output by default
    assert result.trials <= 60


def test_the_causes_are_kept_together_even_where_the_gate_passes_with_fewer():
    """Two nodes carry 50% and 45% of the measured loss; the judging images pass with the first alone (a marginal
    pass), so a search that stopped there would fail the next images. The causes are kept together from the first
    trial and pruning never drops one; nodes below a tenth of the loss are still dropped where the gate allows."""
    from enginekit.compare.repair import cause_nodes, search

    names = [f"n{i}" for i in range(20)]
    ranking = {"n3": 0.50, "n7": 0.45, **{n: 0.05 / 18 for n in names if n not in ("n3", "n7")}}
    assert cause_nodes(sorted(names, key=lambda n: -ranking[n]), ranking) == ["n3", "n7"]
    tried = []

    def trial(nodes):
        tried.append(sorted(nodes))
        ok = "n3" in nodes
        return object(), ok, 0.01 if ok else 0.5

    result = search(trial, names, ranking)
    assert sorted(result.nodes) == ["n3", "n7"] and result.trials == 2, (result.nodes, tried)
    # without the rule's causes (the shares spread below a tenth each), the fewest that pass: one node
    flat = {n: 1.0 + (0.5 if n == "n3" else 0.0) for n in names}
    assert search(trial, names, flat).nodes == ["n3"]


def test_search_that_cannot_pass_says_so():
    from enginekit.compare.repair import search
    from enginekit.errors import ParityError

    with pytest.raises(ParityError, match="even with 4 of 4"):
        search(lambda nodes: (None, False, 0.5), ["a", "b", "c", "d"], None)


def _qdq_pair_graph(tmp_path: Path):
    """x -> Q/DQ -> Conv(W as Q/DQ of an int8 weight) -> y, and its FP32 source."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((2, 1, 1, 1)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    src = helper.make_model(helper.make_graph([helper.make_node("Conv", ["x", "W"], ["y"], name="conv")], "g", [x], [y],
                                              [numpy_helper.from_array(w, "W")]), opset_imports=[helper.make_opsetid("", 17)])
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    wq = numpy_helper.from_array(np.clip(np.round(w / 0.5), -127, 127).astype(np.int8), "Wq")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
             helper.make_node("DequantizeLinear", ["Wq", "s", "z"], ["Wd"], name="wdq"),
             helper.make_node("Conv", ["xd", "Wd"], ["y"], name="conv")]
    q = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [scale, zero, wq]),
                          opset_imports=[helper.make_opsetid("", 17)])
    for m in (src, q):
        m.ir_version = 9
    return src, q


def test_strip_qdq_gives_the_fp32_node_back(tmp_path):
    from enginekit.compare.repair import quantized_nodes, strip_qdq
    from enginekit.onnx import runtime

    import onnx

    src, q = _qdq_pair_graph(tmp_path)
    onnx.save(q, str(tmp_path / "q.onnx"))
    assert quantized_nodes(tmp_path / "q.onnx") == ["conv"]
    stripped = strip_qdq(q, src, ["conv"])
    assert [n.op_type for n in stripped.graph.node] == ["Conv"]  # Q/DQ pairs nobody reads are gone
    feed = {"x": np.array([[[[0.3, -1.7], [2.2, 0.05]]]], np.float32)}
    want = runtime.run(runtime.session_from_model(src), feed)["y"]
    got = runtime.run(runtime.session_from_model(stripped), feed)["y"]
    quant = runtime.run(runtime.session_from_model(q), feed)["y"]
    assert np.allclose(got, want) and not np.allclose(quant, want)
    assert strip_qdq(q, src, []).graph.node[0].op_type == "QuantizeLinear"  # untouched without nodes


def test_own_error_is_each_nodes_own_rounding_measured_in_one_run(tmp_path):
    """The screen's figure for a node is the rel L2 between its output in the Q/DQ graph and in FP32 from the same
    inputs: here the whole graph is one quantized Conv, so it equals the rel L2 of the two graphs' outputs; a finer
    scale rounds less and gives a smaller figure (the figure follows the rounding, not the node)."""
    from onnx import numpy_helper

    from enginekit.compare.repair import own_error
    from enginekit.onnx import runtime

    src, q = _qdq_pair_graph(tmp_path)
    feeds = [{"x": np.random.default_rng(i).uniform(-1, 1, (1, 1, 2, 2)).astype(np.float32)} for i in range(3)]
    want = [runtime.run(runtime.session_from_model(src), f)["y"] for f in feeds]
    got = [runtime.run(runtime.session_from_model(q), f)["y"] for f in feeds]
    diff = sum(float(np.square(g.astype(np.float64) - w).sum()) for g, w in zip(got, want))
    norm = sum(float(np.square(w.astype(np.float64)).sum()) for w in want)
    coarse = own_error(q, src, ["conv"], feeds)
    assert coarse["conv"] > 0.1 and np.isclose(coarse["conv"], np.sqrt(diff / norm), rtol=1e-5), coarse
    for init in q.graph.initializer:  # the same graph quantized at a 25x finer step
        if init.name == "s":
            init.CopyFrom(numpy_helper.from_array(np.array(0.02, np.float32), "s"))
        elif init.name == "Wq":
            w = numpy_helper.to_array(src.graph.initializer[0])
            init.CopyFrom(numpy_helper.from_array(np.clip(np.round(w / 0.02), -127, 127).astype(np.int8), "Wq"))
    fine = own_error(q, src, ["conv"], feeds)
    assert 0 < fine["conv"] < coarse["conv"] / 10, (fine, coarse)


def _plant_an_outlier(weights: Path, photo: Path, out: Path, scale: float = 300.0) -> str:
    """The trained detector with one INT8-hostile layer: the first convolution's most active output channel
    scaled up ``scale`` times (BatchNorm weight and bias) and the next convolution's weights for that channel
    scaled down as much, so the FP32 model still detects while that activation's range swamps the other 15
    channels of the tensor /model.1/conv/Conv quantizes per tensor. Returns the node the loss comes from."""
    import torch
    from PIL import Image

    ckpt = torch.load(weights, weights_only=False)
    model = ckpt["model"].float()
    first, second = model.model[0], model.model[1]
    image = np.asarray(Image.open(photo).convert("RGB").resize((320, 320)), np.float32) / 255
    with torch.no_grad():
        channel = int(first(torch.from_numpy(image).permute(2, 0, 1)[None]).mean((0, 2, 3)).argmax())
        first.bn.weight[channel] *= scale
        first.bn.bias[channel] *= scale
        second.conv.weight[:, channel] /= scale
    ckpt["model"], ckpt["ema"] = model.half(), None
    torch.save(ckpt, out)
    return "/model.1/conv/Conv"


def test_int8_repair_finds_a_planted_culprit(trained_detector, tmp_path, monkeypatch):
    """A trained detector with one layer made INT8-hostile fails its task gate at the default calibration;
    repair measures each quantized node's effect, names that layer first, keeps it (and at most two others)
    in FP32 within a few trials and passes, judged on images it did not calibrate on. Each trial is an ONNX
    edit of the one quantized graph: ModelOpt quantizes once, whatever the trials."""
    from trained_detector import write_held_out_images

    from enginekit import api
    from enginekit.cache import Cache
    from enginekit import pipeline

    images = write_held_out_images(tmp_path / "images", count=24, size=640, seed=4242)
    culprit = _plant_an_outlier(trained_detector.weights, sorted(images.glob("*.png"))[0], tmp_path / "planted.pt")
    quantized = []
    real_quantize = pipeline.quantize_int8  # where the pipeline looks it up when it quantizes
    monkeypatch.setattr(pipeline, "quantize_int8", lambda *a, **k: quantized.append(a) or real_quantize(*a, **k))
    out = api.build("yolov8n", weights=tmp_path / "planted.pt", precision="int8", profiles=["1x3x320x320"],
                    calib_data=images, calib_count=8, repair=True, verify=False,
                    cache=Cache(tmp_path / "cache"), quiet=True)
    rec = out.manifest["repair"]
    # the gate compares something: the planted FP32 model finds enough to judge, and default INT8 fails its task
    assert rec["task_before"]["reference_detections"] >= 22, rec["task_before"]
    assert any(f.startswith("task ") for f in rec["failures_before"]), rec["failures_before"]
    assert rec["passed"] and not rec["failures_after"], rec
    assert rec["causes"][0]["node"] == culprit, rec["causes"][:3]  # the cause is named first, as measured
    assert culprit in rec["nodes"] and len(rec["nodes"]) <= 3, rec["nodes"]
    assert rec["trials"] <= 8, rec["trials"]
    assert "not calibrated on" in rec["judged_on"], rec["judged_on"]  # 16 of the 24: none it calibrated on
    assert rec["task_after"]["recall"] >= 0.95 and rec["task_after"]["compared"] > 0  # the task was gated too
    # one ModelOpt run per calibration method measured (max fails here, so entropy is measured too): the trials are
    # ONNX edits of the graph chosen
    choice = out.manifest["calibration_choice"]
    assert len(quantized) == len(choice["rows"]) == 2, choice
    assert out.manifest["precision"]["repaired_nodes"] == rec["nodes"]
    assert out.manifest["chain"][-1]["stage"] == "int8-repair"


def test_repaired_is_a_pipeline_stage_keyed_as_before(tmp_path):
    """Repair's INT8 result is the pipeline's ``repaired`` stage: kind onnx-int8-repair, keyed by the INT8
    graph and the nodes (the key of before), the stripped graph stored once and found the second time."""
    import onnx

    from enginekit.cache import Cache
    from enginekit.hashing import key_for
    from enginekit.pipeline import Artifact, Stages

    src, q = _qdq_pair_graph(tmp_path)
    onnx.save(src, str(tmp_path / "src.onnx"))
    onnx.save(q, str(tmp_path / "q.onnx"))
    pipe = Stages(None, Cache(tmp_path / "cache"))
    quantized, source = Artifact.given(tmp_path / "q.onnx"), Artifact.given(tmp_path / "src.onnx")
    first = pipe.repaired(quantized, source, ["conv"], ["^head$"])
    parts = {"stage": "int8-repair", "input": quantized.sha256, "nodes": ["conv"], "edit": "strip_qdq/1"}
    assert (first.status, first.entry.kind, first.entry.key) == ("miss", "onnx-int8-repair", key_for(parts))
    assert [n.op_type for n in onnx.load(str(first.path)).graph.node] == ["Conv"]  # Q/DQ around conv removed
    assert first.manifest["repaired_nodes"] == ["conv"] and first.manifest["exclude"] == ["^head$"]
    again = pipe.repaired(quantized, source, ["conv"], ["^head$"])
    assert again.status == "hit" and again.entry.key == first.entry.key


def test_repair_memory_is_kept_by_the_pipeline(tmp_path):
    """A passing search's nodes are recalled by the same search description, not by another."""
    from enginekit.cache import Cache
    from enginekit.pipeline import Stages

    pipe = Stages(None, Cache(tmp_path / "cache"))
    search = {"search": "sensitivity/2", "source": "abc", "precision": "int8", "exclude": []}
    assert pipe.recalled_repair(search) is None
    pipe.remember_repair(search, ["conv"], {"passed": True})
    kept = pipe.recalled_repair(search)
    assert kept.kind == "repair" and kept.manifest["nodes"] == ["conv"] and kept.manifest["result"] == {"passed": True}
    assert pipe.recalled_repair({**search, "precision": "fp16"}) is None
