"""``enginekit verify`` with no target (the CI gate) checks every cached engine or names the ones it
cannot check: an engine built from an ONNX file has no PyTorch model to compare against, and it fails
the gate unless the user allows it (it used to be left out, silently)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_one_line_error


@pytest.fixture(scope="module")
def onnx_engine_cache(tmp_path_factory):
    """A private cache holding one engine built from a two-convolution ONNX file (no model recorded)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from enginekit import api
    from enginekit.cache import Cache

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 32, 32])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 8, 32, 32])
    nodes = [helper.make_node("Conv", ["images", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["out"])]
    model = helper.make_model(helper.make_graph(nodes, "small", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    folder = tmp_path_factory.mktemp("verify-all")
    onnx.save(model, folder / "small.onnx")
    root = folder / "cache"
    outcome = api.build(str(folder / "small.onnx"), profiles=["1x3x32x32"], verify=False, cache=Cache(root))
    assert not outcome.entry.manifest.get("model_request")  # what makes it uncheckable
    return root, outcome.entry.key


def test_an_engine_with_no_model_fails_the_gate_naming_it(run_cli, onnx_engine_cache):
    root, key = onnx_engine_cache
    result = run_cli("verify", env={"ENGINEKIT_CACHE": str(root)})
    line = assert_one_line_error(result, 1, key[:12], "cannot be checked", "--allow-unverifiable")
    assert "no engines in the cache" not in line
    assert "verify small" in result.stderr  # listed in the table, not left out


def test_allowed_it_is_listed_and_left_out_of_the_verdict(run_cli, onnx_engine_cache):
    from enginekit import api
    from enginekit.cache import Cache

    root, key = onnx_engine_cache
    outcome = api.verify(cache=Cache(root), allow_unverifiable=True, quiet=True)
    (report,) = outcome.reports
    assert report.excused and report.engine_key == key and not report.failures()
    assert "allowed by --allow-unverifiable" in report.artifacts[0].reason
    assert outcome.passed  # listed, not failed on (docs/verify-ci.md): the user allowed it
    result = run_cli("verify", "--allow-unverifiable", env={"ENGINEKIT_CACHE": str(root)})
    assert result.code == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert key[:12] in said and "allowed by --allow-unverifiable" in said and "error:" not in said
    assert "0 engine(s) checked; 1 listed as not checked" in said  # the verdict says no more than was checked
