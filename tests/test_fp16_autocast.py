"""AutoCast's shortcuts (stages/modelopt: autocast) write the graph ModelOpt's own AutoCast writes.

AutoCast keeps a node in FP32 when a tensor it reads or writes exceeds 512 in the reference run. enginekit
measures those ranges in the graph instead of copying every tensor out (range_statistics) and sweeps dead
casts in linear time; the figures handed to AutoCast, and so the FP16 graph, must be ModelOpt's own.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from enginekit.stages import modelopt as ek_modelopt
from enginekit.stages.modelopt import fp16 as modelopt_fp16


def stats_tuple(stats) -> tuple:
    """A TensorStats (or ModelOpt's raw single-batch array) as comparable figures; NaN made comparable."""
    if isinstance(stats, np.ndarray):
        if stats.size == 0:
            return (0, 0, 0, stats.shape)
        stats = (np.max(np.abs(stats)), np.min(stats), np.max(stats), stats.shape)
    else:
        stats = (stats.absmax, stats.min_val, stats.max_val, tuple(stats.shape))

    def norm(v):
        v = float(v) if not isinstance(v, tuple) else v
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    return tuple(norm(v) for v in stats)


def tricky_model() -> onnx.ModelProto:
    """Float tensors with NaN, infinity, values past 512, an empty slice, rearrangements of each; int and bool ones."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6])
    inits = [
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("big", TensorProto.FLOAT, [], [1000.0]),
        helper.make_tensor("shape2d", TensorProto.INT64, [2], [4, 6]),
        helper.make_tensor("s0", TensorProto.INT64, [1], [0]),
        helper.make_tensor("s_end", TensorProto.INT64, [1], [0]),
        helper.make_tensor("ax", TensorProto.INT64, [1], [2]),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "big"], ["scaled"], name="scale"),              # past 512
        helper.make_node("Reshape", ["scaled", "shape2d"], ["flat"], name="flat"),      # rearranges a measured one
        helper.make_node("Transpose", ["flat"], ["flat_t"], name="flat_t", perm=[1, 0]),  # rearranges a rearranged
        helper.make_node("Reshape", ["x", "shape2d"], ["x_flat"], name="x_flat"),       # rearranges the input
        helper.make_node("Div", ["x", "zero"], ["ratio"], name="ratio"),               # inf, and NaN where x is 0
        helper.make_node("Identity", ["ratio"], ["ratio_id"], name="ratio_id"),        # rearranges a NaN tensor
        helper.make_node("Log", ["x"], ["log"], name="log"),                           # NaN for x < 0, -inf at 0
        helper.make_node("Slice", ["x", "s0", "s_end", "ax"], ["empty"], name="empty"),  # no elements
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),                     # int64
        helper.make_node("Greater", ["x", "zero"], ["positive"], name="positive"),     # bool
        helper.make_node("Cast", ["positive"], ["positive_f"], name="positive_f", to=TensorProto.FLOAT),
        helper.make_node("Add", ["flat_t", "flat_t"], ["out"], name="out"),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "ratio_id", "log", "empty",
                                                                                    "positive_f", "x_flat")]
    graph = helper.make_graph(nodes, "tricky", [x], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("n_batches", [1, 2, 3])
def test_range_statistics_are_modelopts_reference_figures(tmp_path, n_batches):
    from modelopt.onnx.autocast.referencerunner import ReferenceRunner

    rng = np.random.default_rng(n_batches)
    batches = rng.standard_normal((n_batches, 4, 6)).astype(np.float32)
    batches[0, 0, :2] = 0.0  # 0/0: NaN in the first batch only
    if n_batches > 2:
        batches[2] = np.abs(batches[2]) + 1  # a batch with neither NaN nor infinity
    npz = tmp_path / "inputs.npz"
    np.savez(npz, x=batches)  # ModelOpt splits the N rows into N batches of the model's batch 1
    model = tricky_model()

    runner = ReferenceRunner(model, ["cpu"])
    theirs = runner.run(str(npz))
    ours = modelopt_fp16.range_statistics(model, runner._load_inputs(str(npz)), runner.providers)

    assert list(ours) == list(theirs)  # the same tensors, in the same order
    assert {name: stats_tuple(s) for name, s in ours.items()} == {name: stats_tuple(s) for name, s in theirs.items()}
    # the figures are not trivial: past 512, NaN skipped or kept as ModelOpt does, empty, rearranged
    assert stats_tuple(ours["flat_t"])[0] > 512 and stats_tuple(ours["empty"])[3] == (1, 4, 0)


def test_marked_tensor_names_are_polygraphys():
    from polygraphy.backend.onnx.util import all_tensor_names

    model = tricky_model()
    model.graph.node.insert(0, helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", 1, [], [1.0])))
    assert ek_modelopt.marked_tensor_names(model) == all_tensor_names(model)


# -- whole graphs: the shortcut's FP16 graph is ModelOpt's, byte for byte ------------------------------------


def reference_npz(model: str, shape: tuple[int, ...], path: Path) -> Path:
    from enginekit.calibration import CalibrationData
    from enginekit.families import resolve

    adapter = resolve(model)
    np.savez(path, **{adapter.input_name: CalibrationData(None, count=2).batch(adapter, shape)})
    return path


def convert(src: Path, out: Path, model: str, npz: Path, shortcuts: bool) -> bytes:
    from enginekit.families import resolve
    from enginekit.stages.fp16 import convert_fp16

    keep = sorted(resolve(model).fp16_keep_fp32) or None
    convert_fp16(src, out, keep_fp32_nodes=keep, calibration=npz, shortcuts=shortcuts)
    return out.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("model, fixture, shape", [
    ("yolo12n", "yolo_export", (1, 3, 640, 640)),
    ("depth", "depth_export", (1, 3, 224, 224)),  # the 518 export is dynamic in H and W
])
def test_shortcut_fp16_graph_is_modelopts(model, fixture, shape, request, tmp_path, monkeypatch):
    src = request.getfixturevalue(fixture).artifacts[1].path  # the simplified FP32 graph
    npz = reference_npz(model, shape, tmp_path / "ref.npz")
    measured = []
    real = modelopt_fp16.range_statistics

    def spy(*args, **kwargs):
        measured.append(real(*args, **kwargs))
        return measured[-1]

    monkeypatch.setattr(modelopt_fp16, "range_statistics", spy)
    own = convert(src, tmp_path / "own.onnx", model, npz, shortcuts=False)
    assert measured == []  # ModelOpt's own reference run
    fast = convert(src, tmp_path / "fast.onnx", model, npz, shortcuts=True)
    (stats,) = measured

    assert fast == own
    # What makes the comparison able to fail: the reference run puts tensors past AutoCast's 512,
    # and AutoCast keeps their nodes in FP32 (casts around them).
    assert sum(s.absmax > 512 for s in stats.values()) > 0
    assert sum(n.op_type == "Cast" for n in onnx.load(str(tmp_path / "fast.onnx")).graph.node) > 2


@pytest.mark.slow
def test_other_reference_ranges_give_another_graph(depth_export, tmp_path, monkeypatch):
    """The comparison above can fail: ranges that differ from ModelOpt's (all under 512) change the graph."""
    src = depth_export.artifacts[1].path
    npz = reference_npz("depth", (1, 3, 224, 224), tmp_path / "ref.npz")
    real = modelopt_fp16.range_statistics

    def flattened(*args, **kwargs):
        stats = real(*args, **kwargs)
        for s in stats.values():
            s.absmax = min(s.absmax, 1.0)
        return stats

    measured = convert(src, tmp_path / "measured.onnx", "depth", npz, shortcuts=True)
    monkeypatch.setattr(modelopt_fp16, "range_statistics", flattened)
    assert convert(src, tmp_path / "flat.onnx", "depth", npz, shortcuts=True) != measured


def test_shortcuts_off_by_environment(monkeypatch):
    monkeypatch.setenv(ek_modelopt.SHORTCUTS_ENV, "0")
    with ek_modelopt.autocast() as run:
        assert run.shortcuts is False
    with ek_modelopt.quantize_shortcuts() as run:
        assert run.shortcuts is False
    monkeypatch.delenv(ek_modelopt.SHORTCUTS_ENV)
    with ek_modelopt.autocast() as run:
        assert run.shortcuts is True
