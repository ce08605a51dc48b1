"""Attention fused for ONNX Runtime (enginekit.onnx.attention): the rewrite, its equality with the plain
graph on the CPU, and the ONNX Runtime CUDA backend running the fused copy."""

from __future__ import annotations

import collections

import numpy as np
import pytest


def _ops(model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _run(model, feeds: dict, outputs: list[str] | None = None) -> dict:
    import onnxruntime as ort

    model.ir_version = min(model.ir_version, 10)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = outputs or [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _attention_graph(*, scale_on: str, merge: bool, dtype=np.float32, heads=4, head=8, classifier=False):
    """x (B,S,C) -> one self-attention block as PyTorch's SDPA exports it; ``merge``: heads merged back by
    Transpose + Reshape (else something between them keeps (B,S,H,D)); ``classifier``: a Softmax that is
    not attention."""
    from onnx import TensorProto, helper, numpy_helper

    c = heads * head
    rng = np.random.default_rng(0)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    inits = [numpy_helper.from_array((rng.standard_normal((c, c)) / np.sqrt(c)).astype(dtype), f"w{n}")
             for n in "qkv"]
    inits += [numpy_helper.from_array(np.array([0, 0, heads, head], np.int64), "split"),
              numpy_helper.from_array(np.array([0, 0, c], np.int64), "merge"),
              numpy_helper.from_array(np.array(head ** -0.25, dtype), "sqrt_scale"),
              numpy_helper.from_array(np.array(head ** 0.5, dtype), "div")]
    nodes = []
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}3"]),
                  helper.make_node("Reshape", [f"{n}3", "split"], [f"{n}4"])]
    nodes += [helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3])]
    if scale_on == "qk":
        nodes += [helper.make_node("Mul", ["qt", "sqrt_scale"], ["qs"]),
                  helper.make_node("Mul", ["kt", "sqrt_scale"], ["ks"]),
                  helper.make_node("MatMul", ["qs", "ks"], ["scores"])]
    else:
        nodes += [helper.make_node("MatMul", ["qt", "kt"], ["raw"]),
                  helper.make_node("Div", ["raw", "div"], ["scores"])]
    nodes += [helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "vt"], ["att"]),
              helper.make_node("Transpose", ["att"], ["att_t"], perm=[0, 2, 1, 3])]
    if merge:
        nodes.append(helper.make_node("Reshape", ["att_t", "merge"], ["y"]))
    else:
        nodes += [helper.make_node("Relu", ["att_t"], ["att_r"]),
                  helper.make_node("Reshape", ["att_r", "merge"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", elem, ["batch", "seq", c])]
    if classifier:
        nodes.append(helper.make_node("Softmax", ["y"], ["cls"], axis=-1))
        outputs.append(helper.make_tensor_value_info("cls", elem, ["batch", "seq", c]))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", elem, ["batch", "seq", c])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("scale_on", ["qk", "scores"])
@pytest.mark.parametrize("merge", [True, False])
def test_an_sdpa_block_becomes_one_multihead_attention_with_the_same_output(scale_on, merge):
    from enginekit.onnx.attention import fuse_attention

    model = _attention_graph(scale_on=scale_on, merge=merge, classifier=True)
    x = np.random.default_rng(1).standard_normal((2, 37, 32)).astype(np.float32)
    plain = _run(model, {"x": x})
    fused = _attention_graph(scale_on=scale_on, merge=merge, classifier=True)
    report = fuse_attention(fused)
    assert (report.fused, report.merged) == (1, int(merge))
    ops = _ops(fused)
    assert ops["MultiHeadAttention"] == 1
    assert ops["Softmax"] == 1  # the classifier's Softmax stays; the attention's is gone
    assert ops["MatMul"] == 3  # the Q/K/V projections only
    assert ops["Transpose"] == (0 if merge else 2)  # merged: no head split left at all
    mha = next(n for n in fused.graph.node if n.op_type == "MultiHeadAttention")
    attrs = {a.name: a for a in mha.attribute}
    assert mha.domain == "com.microsoft" and attrs["num_heads"].i == 4
    assert attrs["scale"].f == pytest.approx(8 ** -0.5, rel=1e-6)
    got = _run(fused, {"x": x})
    for name in ("y", "cls"):
        assert _rel(got[name], plain[name]) < 1e-6


def test_fp16_block_fuses_in_fp16():
    from enginekit.onnx.attention import fuse_attention

    model = _attention_graph(scale_on="qk", merge=True, dtype=np.float16)
    ref = _attention_graph(scale_on="qk", merge=True)
    x = np.random.default_rng(2).standard_normal((1, 50, 32)).astype(np.float32)
    assert fuse_attention(model).fused == 1
    mha = next(n for n in model.graph.node if n.op_type == "MultiHeadAttention")
    assert mha.input  # inputs are the FP16 (B,S,H*D) reshapes of the FP16 Q/K/V
    try:
        got = _run(model, {"x": x.astype(np.float16)})["y"]
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"this ONNX Runtime's CPU provider does not run FP16 MultiHeadAttention: {str(exc)[:120]}")
    assert got.dtype == np.float16
    assert _rel(got, _run(ref, {"x": x})["y"]) < 5e-3


def test_a_graph_without_attention_is_left_alone():
    from enginekit.onnx.attention import fuse_attention

    model = _attention_graph(scale_on="qk", merge=True)
    for n in model.graph.node:  # K no longer transposed to (B,H,D,S): not the attention pattern
        if n.output[0] == "kt":
            n.attribute[0].ints[:] = [0, 2, 1, 3]
    before = model.SerializeToString()
    report = fuse_attention(model)
    assert report.fused == 0 and len(report.skipped) == 1
    assert model.SerializeToString() == before


def test_the_cuda_backend_gets_the_fused_copy_or_the_graph_itself(tmp_path, cache):
    """What the onnxruntime-cuda backend runs with fuse_attention: the cached fused copy; the graph itself where nothing
    fuses, or where the rewrite fails (with a warning, not an error)."""
    import onnx

    from enginekit import reporting
    from enginekit.backends.ort import _fused_graph

    graph = tmp_path / "attention.onnx"
    onnx.save(_attention_graph(scale_on="qk", merge=True), str(graph))
    path, count = _fused_graph(graph, cache)
    assert count == 1 and path != graph and _ops(onnx.load(str(path)))["MultiHeadAttention"] == 1
    plain = tmp_path / "plain.onnx"
    model = _attention_graph(scale_on="qk", merge=True)
    for n in model.graph.node:
        if n.op_type == "Softmax":
            n.attribute[0].i = 2  # over the query axis: not attention
    onnx.save(model, str(plain))
    assert _fused_graph(plain, cache) == (plain, 0)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a graph")
    with reporting.collecting(quiet=True) as seen:
        assert _fused_graph(broken, cache) == (broken, 0)
    assert any("attention fusion of broken.onnx failed" in w for w in seen.warnings)


@pytest.fixture(scope="module")
def depth_small(tmp_path_factory, cache):
    """Depth-Anything-V2-small (random weights), FP32, exported at 140x140 (H/W stay dynamic)."""
    from enginekit import api

    out = tmp_path_factory.mktemp("depth-attention")
    return api.export("depth", random_init=True, input="1x3x140x140", output=out / "depth.onnx", cache=cache,
                      quiet=True).output


@pytest.mark.slow
def test_depth_anything_attention_fuses_and_equals_the_plain_graph(depth_small, cache):
    import onnx

    from enginekit.families import resolve
    from enginekit.onnx.attention import fuse_attention, fused_attention_copy

    assert resolve("depth").fusable_attention and not resolve("yolo12n").fusable_attention
    plain = onnx.load(str(depth_small))
    fused = onnx.load(str(depth_small))
    report = fuse_attention(fused)
    assert (report.fused, report.merged) == (12, 12) and not report.skipped
    ops = _ops(fused)
    assert ops["MultiHeadAttention"] == 12 and ops["Softmax"] == 0
    # the attention blocks' own outputs (named as in the plain graph) and the depth map
    names = [n.output[0] for n in fused.graph.node if n.op_type == "MultiHeadAttention"] + ["depth"]
    for model in (plain, fused):
        known = {o.name for o in model.graph.output}
        model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    x = np.random.default_rng(3).standard_normal((2, 3, 168, 196)).astype(np.float32)
    a, b = _run(plain, {"pixel_values": x}, names), _run(fused, {"pixel_values": x}, names)
    for name in names:
        assert _rel(b[name], a[name]) < 1e-5, name
    # the file-level copy: built once into the cache, then found there
    path, count = fused_attention_copy(depth_small, cache)
    again, count2 = fused_attention_copy(depth_small, cache)
    assert count == count2 == 12 and path == again and path != depth_small
    got = _run(onnx.load(str(path)), {"pixel_values": x}, ["depth"])["depth"]
    assert _rel(got, a["depth"]) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_ort_cuda_runs_the_fused_depth_graph_like_the_plain_one(precision, tmp_path, cache):
    import torch

    import enginekit
    from conftest import varied_depth_weights

    kw = dict(weights=varied_depth_weights(tmp_path), precision=precision, backend="onnxruntime-cuda", cache=cache)
    for graph in (False, True):
        plain = enginekit.load("depth", fuse_attention=False, cuda_graph=graph, **kw)
        fused = enginekit.load("depth", cuda_graph=graph, **kw)  # the family's default: fused
        assert plain.session.fused_attention == 0 and fused.session.fused_attention == 12
        assert fused.session.path != fused.session.source_path == plain.session.path
        for batch in (1, 3):
            x = torch.rand((batch, 3, 518, 518), device="cuda", generator=torch.Generator("cuda").manual_seed(batch))
            with torch.cuda.stream(plain.session.stream):
                a = plain.session(x)["depth"].clone()
            with torch.cuda.stream(fused.session.stream):
                b = fused.session(x)["depth"].clone()
            torch.cuda.synchronize()
            assert a.std() > 0
            rel = (torch.linalg.norm(a.double() - b.double()) / torch.linalg.norm(a.double())).item()
            assert rel < 5e-3, (graph, batch, rel)  # the family's FP16 limit; FP32 as TF32 GEMMs round
