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


def test_int8_repair_on_the_trained_detector(trained_detector, detector_images, tmp_path, monkeypatch):
    """A gate the INT8 graph fails (scores rel L2 tightened to 0.05; default INT8 passes): repair keeps
    a few nodes from all over the graph in FP32 and passes parity and task gates; figures recorded.
    Each trial is an ONNX edit of the one quantized graph: ModelOpt quantizes once, whatever the trials."""
    from enginekit import api
    from enginekit.cache import Cache
    from enginekit.stages import int8

    quantized = []
    real_quantize = int8.quantize_int8  # the pipeline imports it where it quantizes
    monkeypatch.setattr(int8, "quantize_int8", lambda *a, **k: quantized.append(a) or real_quantize(*a, **k))
    limit = 0.05
    for _ in range(4):  # a limit the default INT8 graph fails: a fifth under its own worst error
        out = api.build("yolov8n", weights=trained_detector.weights, precision="int8", profiles=["1x3x320x320"],
                        calib_data=detector_images, calib_method="entropy", repair=True,
                        tolerances=[f"int8.rel_l2={limit:.6g}"], verify=False,
                        cache=Cache(tmp_path / "cache"), quiet=True)
        rec = out.manifest["repair"]
        if rec["failures_before"]:
            break
        assert rec["passed"] and not rec["nodes"] and rec["trials"] == 1, rec  # nothing to repair: nothing moved
        limit = rec["rel_l2_before"] * 0.8
    assert rec["passed"] and rec["failures_before"] and not rec["failures_after"], rec
    # a gate 5x tighter than the default on every output part: with only the head's last convolutions and the
    # DFL excluded (the family's default), the search kept 18 of 81 candidates (22%); with the whole head
    # excluded (19 nodes more, none of them candidates) it had kept at most 15% of the candidates left
    assert 0 < len(rec["nodes"]) <= 0.25 * rec["candidates"], (len(rec["nodes"]), rec["candidates"])
    assert rec["task_after"]["recall"] >= 0.95 and rec["task_after"]["compared"] > 0  # the task was gated too
    # an ONNX edit per trial, not a ModelOpt run (how long a trial takes is the benchmarks' business)
    assert rec["trials"] > 1 and len(quantized) == 1, (rec["trials"], len(quantized))
    assert out.manifest["precision"]["repaired_nodes"] == rec["nodes"]
    assert out.manifest["chain"][-1]["stage"] == "int8-repair"


def test_repaired_is_a_pipeline_stage_keyed_as_before(tmp_path):
    """Repair's INT8 result is the pipeline's ``repaired`` stage: kind onnx-int8-repair, keyed by the INT8
    graph and the nodes (the key of before), the stripped graph stored once and found the second time."""
    import onnx

    from enginekit.cache import Cache, key_for
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
