"""ONNX Runtime CUDA's captured graphs per input shape: which session runs a shape, and the fixed dimensions
that let ORT capture a graph of dynamic H/W (its shape computations folded, nothing left for the CPU)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")


def _ops(path, dims, tmp_path):
    """Op counts of the graph ORT runs after its basic optimizations, with ``dims`` fixed."""
    import onnx

    from enginekit.onnx.runtime import options

    opts = options(dims=dims)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(tmp_path / f"optimized-{len(dims)}.onnx")
    ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("hw", [(384, 686), (336, 448)])
def test_fixed_dimensions_fold_the_depth_graphs_shape_computations(depth_export, tmp_path, hw):
    """Depth-Anything's graph (dynamic batch, H, W) computes shapes at run time: ORT leaves those nodes on the CPU,
    and a graph with nodes on the CPU is not captured. Its dimensions fixed by name, they fold to constants, and
    the session computes the same depth on a non-square frame's input."""
    from enginekit.backends.ort import OnnxRuntimeCuda
    from enginekit.onnx.runtime import session

    path = depth_export.artifacts[1].path
    plain = session(path)
    backend = OnnxRuntimeCuda.__new__(OnnxRuntimeCuda)
    backend._dim_names = tuple(plain.get_inputs()[0].shape)
    dims = backend.fixed_dims((1, 3, *hw))
    assert sorted(dims.values()) == sorted([1, *hw]) and len(dims) == 3, dims
    before, after = _ops(path, {}, tmp_path), _ops(path, dims, tmp_path)
    assert before["Shape"] > 10  # there is something to fold
    assert after["Shape"] == 0 and sum(after.values()) < sum(before.values())
    x = np.random.default_rng(0).standard_normal((1, 3, *hw), dtype=np.float32)
    fixed = session(path, dims=dims)
    want = plain.run(None, {"pixel_values": x})[0]
    got = fixed.run(None, {"pixel_values": x})[0]
    assert got.shape == (1, *hw) and float(np.abs(want).mean()) > 1e-3
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_a_name_that_takes_two_sizes_is_not_fixed():
    from enginekit.backends.ort import OnnxRuntimeCuda

    backend = OnnxRuntimeCuda.__new__(OnnxRuntimeCuda)
    backend._dim_names = ("batch", 3, "side", "side")
    assert backend.fixed_dims((2, 3, 64, 64)) == {"batch": 2, "side": 64}
    assert backend.fixed_dims((2, 3, 64, 96)) == {}
    backend._dim_names = (1, 3, 640, 640)
    assert backend.fixed_dims((1, 3, 640, 640)) == {}


# -- which session runs a shape (ORT's sessions stood in for: no GPU needed) ------------------------------------

class _Value:
    def __init__(self, shape):
        self._shape = shape

    def shape(self):
        return self._shape

    def data_type(self):
        return "tensor(float)"


class _Binding:
    def __init__(self, session):
        self.session, self.shape = session, None

    def bind_input(self, name, device, index, dtype, shape, ptr):
        self.shape = tuple(shape)

    def bind_output(self, name, *args):
        pass

    def get_outputs(self):
        return [_Value((self.shape[0], 84, 10))]


class _Session:
    def __init__(self, graph, dims, fail_run=False):
        self.graph, self.dims, self.fail_run, self.runs = graph, dims, fail_run, 0

    def io_binding(self):
        return _Binding(self)

    def run_with_iobinding(self, binding, options=None):
        self.runs += 1
        if self.fail_run:
            raise RuntimeError("graph capture refused")


def _backend(*, fixed_hw: bool, fail_create=False, fail_run=False):
    from enginekit.backends.base import SessionInfo
    from enginekit.backends.ort import OnnxRuntimeCuda

    b = OnnxRuntimeCuda.__new__(OnnxRuntimeCuda)
    shape = (None, 3, 384, 384) if fixed_hw else (None, 3, None, None)
    b.info = SessionInfo("onnxruntime-cuda", "cuda:0", "images", ("output0",), shape, np.float32, None)
    b._dim_names = ("batch", 3, 384, 384) if fixed_hw else ("batch", 3, "height", "width")
    b.index, b.stream, b.run_options, b._buffers = 0, None, None, {}
    b.cuda_graph, b.graph_at = True, 1 if fixed_hw else 2
    b.session = _Session(False, None)
    b.made = []

    def make(*, graph, dims=None):
        if fail_create:
            raise RuntimeError("This session cannot use the graph capture feature")
        b.made.append(_Session(graph, dims, fail_run))
        return b.made[-1]

    b._make_session = make
    return b


def test_a_dynamic_graph_is_captured_from_a_shapes_second_run_with_its_dimensions_fixed():
    b = _backend(fixed_hw=False)
    assert b.capture_runs == 4  # one plain run, then ORT's three
    x = torch.zeros(1, 3, 384, 686)
    first = b.infer(x)
    assert b.made == [] and b.session.runs == 2  # learns the outputs, then runs the shape plainly
    second = b.infer(x)
    assert second is first and first["output0"].shape == (1, 84, 10)
    assert [(s.graph, s.dims) for s in b.made] == [(True, {"batch": 1, "height": 384, "width": 686})]
    assert b.made[0].runs == 1 and b.session.runs == 2 and b.graphs == 0
    b.infer(x)
    b.infer(x)  # ORT's third run of the session: captured there
    assert b.made[0].runs == 3 and len(b.made) == 1 and b.graphs == 1
    # a folder of photographs of many sizes: each seen once runs the plain session, no session made for it
    for w in range(500, 520):
        b.infer(torch.zeros(1, 3, 384, w))
    assert len(b.made) == 1 and b.session.runs == 2 + 2 * 20


def test_graph_sessions_are_capped_and_a_fixed_graph_captures_from_the_first_run():
    b = _backend(fixed_hw=False)
    for w in range(600, 612):
        for _ in range(b.capture_runs):
            b.infer(torch.zeros(1, 3, 384, w))
    assert len(b.made) == b.MAX_GRAPHS == 8 and b.graphs == 8  # the rest run the plain session
    assert b.session.runs == 12 * 2 + 4 * 3
    f = _backend(fixed_hw=True)
    assert f.capture_runs == 3
    f.infer(torch.zeros(2, 3, 384, 384))
    assert [(s.graph, s.dims) for s in f.made] == [(True, {"batch": 2})] and f.made[0].runs == 1


@pytest.mark.parametrize("failure", ["create", "run"])
def test_where_ort_refuses_to_capture_every_shape_runs_the_plain_session(failure):
    b = _backend(fixed_hw=True, fail_create=failure == "create", fail_run=failure == "run")
    out = b.infer(torch.zeros(1, 3, 384, 384))
    assert out["output0"].shape == (1, 84, 10)
    assert b.cuda_graph is False and b.capture_runs == 0 and b.graphs == 0
    plain = b.session.runs
    b.infer(torch.zeros(1, 3, 384, 384))
    b.infer(torch.zeros(4, 3, 384, 384))
    assert b.session.runs == plain + 1 + 2 and all(s.runs <= 1 for s in b.made)


def test_a_fixed_input_is_what_the_graph_session_reads(monkeypatch):
    """``infer_fixed``: the shape's graph session is bound to the caller's tensor itself (no copy per run); a later
    call with another tensor of that shape copies it there. ``infer`` binds a buffer of the session's own."""
    b = _backend(fixed_hw=True)
    bound = []
    real = _Binding.bind_input
    monkeypatch.setattr(_Binding, "bind_input", lambda self, *a: (bound.append(a[-1]), real(self, *a))[1])
    x = torch.rand(1, 3, 384, 384)
    b.infer_fixed(x)
    state = b._buffers[(1, 3, 384, 384)]
    assert state["inp"] is x and bound[-1] == x.data_ptr()  # the graph session reads x where it is
    runs = b.made[0].runs
    x.mul_(2)  # rewritten in place (the preprocessing graph's next replay)
    b.infer_fixed(x)
    assert b.made[0].runs == runs + 1 and state["inp"] is x
    y = torch.rand(1, 3, 384, 384)
    b.infer(y)
    assert torch.equal(x, y)  # copied into the bound tensor, then run
    plain = _backend(fixed_hw=True)
    z = torch.rand(1, 3, 384, 384)
    plain.infer(z)
    assert plain._buffers[(1, 3, 384, 384)]["inp"] is not z
