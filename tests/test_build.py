"""Engines through TensorRT-RTX (which builds without a GPU) or TensorRT, and the engine cache contract."""

from __future__ import annotations

import re

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import assert_one_line_error

YOLO_PROFILE = "1x3x320x320:2x3x320x320:4x3x320x320"
DEPTH_PROFILE = "1x3x224x224:1x3x280x280:2x3x392x392"


def build(cache, target, **kw):
    from enginekit import api

    kw.setdefault("random_init", True)
    return api.build(target, cache=cache, quiet=True, **kw)


def assert_manifest(outcome, *, precision, input_name, profile_min, profile_max, out_dtype="float32", passes=True):
    m = outcome.manifest
    assert outcome.engine.is_file() and outcome.engine.stat().st_size > 100_000
    # the plan is raw: no JSON header in front (trtexec and C++ loaders read it as is)
    assert not outcome.engine.read_bytes()[:1] == b"{"
    from enginekit.trt.flavours import default_targets, gpu_info, resolve_flavour

    backend = resolve_flavour()  # TensorRT-RTX, or TensorRT proper where it can build (a GPU)
    assert m["backend"] == backend.name and m["backend_version"] == backend.version
    # this GPU where the backend targets it, else the portable set (7.5, 8.0, 8.6, 8.9, 12.0),
    # less what RTX cannot compile (FP32 GEMM on Turing)
    expected = set(default_targets(backend, gpu_info()))
    assert set(m["targets"]) | set(m.get("dropped_targets", [])) == expected
    (prof,) = m["profiles"]
    assert prof[input_name]["min"] == profile_min and prof[input_name]["max"] == profile_max
    io = {t["name"]: t for t in m["io"]}
    assert io[input_name]["mode"] == "input" and io[input_name]["dtype"] == "float32"
    assert io[input_name]["shape"][0] == -1
    outputs = [t for t in m["io"] if t["mode"] == "output"]
    assert outputs and all(t["dtype"] == out_dtype for t in outputs)
    assert m["precision"]["mode"] == precision
    assert m["parts"]["backend"] == {"name": backend.name, "version": backend.version}
    parity = json.loads((outcome.engine.parent / "parity.json").read_text())
    assert parity["checked"] and (parity["passed"] or not passes), parity.get("failures")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_yolo_engine_with_dynamic_profile(cache, precision):
    """The engine's manifest, and the build's parity of the graph it came from on the informative random
    yolo12n: "pass" only where its boxes and scores depend on the photograph (a plain random YOLO's read
    "not-checked")."""
    if precision == "int8":
        # its boxes and scores hold INT8's limits; its detections need not: the random model's scores are a
        # continuous tail at conf 0.25, so INT8 moves some across it (recall 0.81 on the two photographs at 320).
        # The build judges the graph before it builds: it refuses, naming the task gate, and caches no engine;
        # INT8 passing its gates is shown on the trained detector (test_gates.py, test_one_verdict.py)
        from enginekit.errors import ParityError

        with pytest.raises(ParityError, match=r"yolo12n int8: its graph failed parity \(task "):
            build(cache, "yolo12n", profiles=[YOLO_PROFILE], precision=precision)
        # its record holds the failure: --no-verify skips this build's check, not the earlier one
        with pytest.raises(ParityError, match=r"yolo12n int8: its graph failed an earlier check \(build "):
            build(cache, "yolo12n", profiles=[YOLO_PROFILE], precision=precision, verify=False)
        outcome = build(cache, "yolo12n", profiles=[YOLO_PROFILE], precision=precision, verify=False,
                        accept_failed=True)
        if outcome.status != "hit":  # built here: the manifest keeps the override and the check
            assert outcome.manifest["override"]["accepted"] == "--accept-failed"
            assert any(f"task {m}" in outcome.manifest["override"]["failed_check"] for m in ("recall", "precision"))
        from enginekit.verification.record import engine_record

        assert engine_record(cache, outcome.manifest).verdict == "fail"  # it stays failed wherever it is read
        return
    outcome = build(cache, "yolo12n", profiles=[YOLO_PROFILE], precision=precision)
    assert_manifest(outcome, precision=precision, input_name="images", profile_min=[1, 3, 320, 320],
                    profile_max=[4, 3, 320, 320])
    parity = json.loads((outcome.engine.parent / "parity.json").read_text())
    assert parity["status"] == "pass", parity


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_depth_engine_manifest_with_dynamic_hw_profile(cache, precision):
    """Plumbing: the engine's manifest, profiles and the parity record beside it. A random Depth-Anything's
    depth spreads 5-8% around its mean, so the parity that passes here does not show accuracy (replacing the
    map by its mean passes INT8's limits); gates that can fail are in test_gates.py and test_dense_tasks.py."""
    outcome = build(cache, "depth", profiles=[DEPTH_PROFILE], precision=precision)
    assert_manifest(outcome, precision=precision, input_name="pixel_values", profile_min=[1, 3, 224, 224],
                    profile_max=[2, 3, 392, 392])
    if precision == "fp32":  # the export is the same for every precision: one more engine shows it
        # one dynamic-H/W ONNX serves every profile: the export entry is shared with other profiles
        other = build(cache, "depth", profiles=["1x3x518x518"], precision=precision)
        assert other.artifacts[0].entry.key == outcome.artifacts[0].entry.key


def test_int8_family_exclusions_keep_the_head_out(cache):
    import onnx

    outcome = build(cache, "yolo12n", profiles=[YOLO_PROFILE], precision="int8", verify=False,
                    accept_failed=True)  # the graph's layout: the random yolo12n's INT8 fails its task gates
    int8 = outcome.artifacts[-1]
    assert int8.stage == "int8" and int8.manifest["qdq_nodes"] > 50
    graph = onnx.load(str(int8.path)).graph
    dq_outputs = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    # the detect default: the head's last convolution of each box/class branch (and DFL) stay out of INT8
    last = re.compile(r"/model\.21/(one2one_)?cv[23]\.\d+/(one2one_)?cv[23]\.\d+\.2/.*")
    head_convs = [n for n in graph.node if n.op_type == "Conv" and last.fullmatch(n.name)]
    assert head_convs and not any(i in dq_outputs for n in head_convs for i in n.input)
    body_convs = [n for n in graph.node if n.op_type == "Conv" and n.name.startswith("/model.2/")]
    assert any(i in dq_outputs for n in body_convs for i in n.input)


def test_int8_with_calibration_cache_skips_calibration_byte_identical(run_cli, tmp_path):
    env = cli_env(tmp_path / "cache")
    args = ["build", "yolo12n", "--random-init", "--precision", "int8", "--profile", "1x3x256x256:2x3x256x256:4x3x256x256",
            "--calib-cache", "yolo.calib", "--no-verify"]
    first = run_cli(*args, env=env)
    assert first.code == 0, first.stderr
    assert "calibration: calibrated" in first.stderr
    calib = (tmp_path / "yolo.calib").read_text().splitlines()
    assert calib[0].startswith("TRT-") and len(calib) > 50 and ": " in calib[1]
    # a fresh cache: only the calibration cache file carries over
    second = run_cli(*args, env=cli_env(tmp_path / "cache2"))
    assert second.code == 0, second.stderr
    assert "from calibration cache (no calibration)" in second.stderr
    graphs = [sorted((tmp_path / c / "onnx-int8").glob("*/model.onnx")) for c in ("cache", "cache2")]
    assert len(graphs[0]) == len(graphs[1]) == 1
    assert graphs[0][0].read_bytes() == graphs[1][0].read_bytes()
    assert "Q/DQ layout kept" not in second.stderr  # an empty cache has none: ModelOpt's pass
    # the INT8 entry gone, the Q/DQ layout the last run kept rebuilds the same graph without ModelOpt
    int8 = graphs[1][0].read_bytes()
    shutil.rmtree(tmp_path / "cache2" / "onnx-int8")
    third = run_cli(*args, env=cli_env(tmp_path / "cache2"))
    assert third.code == 0, third.stderr
    assert "from calibration cache (no calibration), Q/DQ layout kept (no ModelOpt)" in third.stderr
    (graph,) = sorted((tmp_path / "cache2" / "onnx-int8").glob("*/model.onnx"))
    assert graph.read_bytes() == int8
    assert json.loads((graph.parent / "manifest.json").read_text())["qdq_layout"] == "kept"


def test_several_profiles_and_target_list(cache):
    outcome = build(cache, "yolo12n", profiles=["1x3x320x320", "2x3x320x320:4x3x320x320:8x3x320x320"],
                    target_cc="8.9,8.6")
    assert len(outcome.manifest["profiles"]) == 2
    assert outcome.manifest["targets"] == ["8.6", "8.9"]


def test_onnx_file_input_and_profile_checks(cache, tmp_path, yolo_export):
    from enginekit.errors import UsageError

    onnx_file = yolo_export.output  # the fp16 graph: dynamic batch, height and width
    outcome = build(cache, str(onnx_file), profiles=["1x3x640x640:2x3x640x640:4x3x640x640"], random_init=False)
    assert outcome.manifest["io"][0]["name"] == "images"
    with pytest.raises(UsageError, match="rank"):
        build(cache, str(onnx_file), profiles=["1x640x640"], random_init=False)
    with pytest.raises(UsageError, match="dynamic inputs"):
        build(cache, str(onnx_file), random_init=False)


def test_engine_reports_it_cannot_run_here(cache):
    from enginekit.trt.flavours import resolve_flavour
    from enginekit.trt.builder import can_run_here

    outcome = build(cache, "yolo12n", profiles=["1x3x320x320"])
    ok, reason = can_run_here(resolve_flavour("tensorrt-rtx"), outcome.manifest, gpu=None)
    assert not ok and "no GPU" in reason and outcome.manifest["backend_version"] in reason  # the installed version
    other_version = dict(outcome.manifest, backend_version="1.6.0.1")
    from enginekit.trt.flavours import GpuInfo

    ok, reason = can_run_here(resolve_flavour("tensorrt-rtx"), other_version, gpu=GpuInfo("RTX 4090", "8.9"))
    assert not ok and "1.6.0.1" in reason and "rebuild" in reason


# -- the CLI: cache hits, concurrency, kills, corruption --------------------------------

def cli_env(root):
    return {"ENGINEKIT_CACHE": str(root)}


def test_second_build_is_a_cache_hit_without_loading_anything(run_cli, tmp_path):
    env = cli_env(tmp_path / "cache")
    args = ["build", "yolo12n", "--random-init", "--precision", "fp16", "--profile", "1x3x256x256:2x3x256x256:4x3x256x256"]
    first = run_cli(*args, env=env)
    assert first.code == 0, first.stderr
    second = run_cli(*args, env=env)
    assert second.code == 0, second.stderr
    assert second.stdout.strip() == first.stdout.strip()
    assert second.stdout.strip().endswith("engine.plan")
    assert "built" not in second.stderr and "load yolo12n" not in second.stderr
    assert second.stderr.count("cached") == 4  # export, simplify, fp16, engine


def test_explain_names_the_changed_part(run_cli, tmp_path):
    env = cli_env(tmp_path / "cache")
    base = ["build", "yolo12n", "--random-init", "--profile", "1x3x256x256", "--no-verify"]
    assert run_cli(*base, env=env).code == 0
    r = run_cli(*base[:-3], "--profile", "2x3x256x256", "--no-verify", "--explain", env=env)
    assert r.code == 0
    assert "explain onnx-export: hit" in r.stderr
    assert "explain engine: miss: differs from entry" in r.stderr and "profiles" in r.stderr


def test_two_concurrent_builds_build_once(tmp_path):
    env = dict(os.environ, ENGINEKIT_CACHE=str(tmp_path / "cache"), COLUMNS="200")
    args = [sys.executable, "-m", "enginekit", "build", "yolo12n", "--random-init", "--profile", "1x3x256x256",
            "--no-verify"]
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    engine_lines = [line for _, err in results for line in err.splitlines() if "✓ engine" in line]
    assert sorted("built" in line for line in engine_lines) == [False, True], engine_lines


# A builder killed mid-build (SIGKILL) leaves no entry: test_cache.py's test_killed_builder_leaves_no_entry
# kills it at a known point, where a sleep here could only guess one.


def test_corrupt_engine_is_reported_and_rebuilt(run_cli, tmp_path):
    env = cli_env(tmp_path / "cache")
    args = ["build", "yolo12n", "--random-init", "--profile", "1x3x256x256", "--no-verify"]
    first = run_cli(*args, env=env)
    plan = first.stdout.strip()
    with open(plan, "r+b") as f:
        f.truncate(1000)
    second = run_cli(*args, env=env)
    assert second.code == 0
    assert "corrupt" in second.stderr
    assert os.path.getsize(plan) > 1000
    ls = run_cli("cache", "ls", env=env)
    assert "corrupt (" not in ls.stdout and "complete" in ls.stdout  # sizes checked (--verify: sha256 too)


def test_cache_verbs(run_cli, tmp_path):
    env = cli_env(tmp_path / "cache")
    plan = run_cli("build", "yolo12n", "--random-init", "--profile", "1x3x256x256", "--no-verify", env=env).stdout.strip()
    key = plan.split("/")[-2]
    assert run_cli("cache", "path", key[:10], env=env).stdout.strip() == plan
    shown = json.loads(run_cli("cache", "show", key[:10], env=env).stdout)
    assert shown["key"] == key and shown["kind"] == "engine"
    assert_one_line_error(run_cli("cache", "show", "abcdef123", env=env), 2, "abcdef123")
    gc = run_cli("cache", "gc", "--max-size", "1K", env=env)
    assert gc.code == 0 and "removed 3 entries" in gc.stderr
    assert_one_line_error(run_cli("cache", "gc", "--max-size", "lots", env=env), 2, "lots")
    assert run_cli("cache", "purge", env=env).code == 0


@pytest.mark.parametrize(
    "args,code,needles",
    [
        (["build", "yolo12n", "--random-init", "--profile", "1x3x384"], 2, ["rank 3"]),
        (["build", "yolo12n", "--random-init", "--profile", "8x3x640x640:4x3x640x640:1x3x640x640"], 2, ["min <= opt <= max"]),
        (["build", "yolo12n", "--random-init", "--profile", "1x3xHxW"], 2, ["malformed"]),
        (["build", "depth", "--random-init", "--profile", "1x4x384x384"], 2, ["4 channels"]),
        (["build", "yolo12n", "--random-init", "--trt", "trt"], 2, ["unknown TensorRT flavour 'trt'"]),
        (["build", "yolo12n", "--random-init", "--trt", "tensorrt"], 3, ["pip install"]),
        (["build", "yolo12n", "--random-init", "--target-cc", "9.0"], 2, ["9.0"]),
        (["build", "yolo12n", "--random-init", "--precision", "int4"], 2, ["unknown precision"]),
        (["build", "missing.onnx"], 2, ["not found"]),
        (["build", "yolo12n", "--random-init", "--precision", "int8", "--calib-data", "empty"], 2, ["has no images"]),
        (["build", "yolo12n", "--random-init", "--precision", "int8", "--calib-data", "nowhere"], 2, ["not found"]),
        (["build", "yolo12n", "--random-init", "--precision", "int8", "--calib-data", "broken",
          "--profile", "1x3x256x256"], 2, ["no readable images"]),
        (["build", "yolo12n", "--random-init", "--precision", "int8", "--calib-method", "magic"], 2, ["unknown calibration method"]),
    ],
)
def test_build_bad_inputs(run_cli, tmp_path, args, code, needles):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.jpg").write_bytes(b"not an image")
    r = run_cli(*args, env=cli_env(tmp_path / "cache"))
    assert_one_line_error(r, code, *needles)
    assert not (tmp_path / "cache" / "engine").exists()


def test_foreign_onnx_file_builds_in_fp16(cache, tmp_path):
    """An ONNX enginekit did not write (no family metadata) still goes through fp16 and the build."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name="relu")],
        "foreign", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32, 32])], initializer=[w])
    path = tmp_path / "foreign.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))
    outcome = build(cache, str(path), precision="fp16", random_init=False)
    assert outcome.manifest["io"][1] == {"name": "y", "mode": "output", "dtype": "float32", "shape": [1, 8, 32, 32]}
    assert outcome.manifest["parity"]["passed"] is None  # no PyTorch model to compare against: said, not faked


def test_fp8_is_refused_for_targets_without_it_and_built_for_those_with_it(cache, run_cli, tmp_path):
    import onnx

    r = run_cli("build", "yolo12n", "--random-init", "--precision", "fp8", "--profile", "1x3x256x256",
                env=cli_env(tmp_path / "cache"))
    assert_one_line_error(r, 2, "fp8 needs compute capability 8.9", "7.5", "--target-cc 8.9,12.0")
    outcome = build(cache, "yolo12n", profiles=["1x3x256x256"], precision="fp8", target_cc="8.9,12.0")
    assert outcome.manifest["targets"] == ["8.9", "12.0"]
    graph = onnx.load(str(outcome.artifacts[-1].path)).graph
    fp8 = onnx.TensorProto.FLOAT8E4M3FN
    zero_points = {i.name: i.data_type for i in graph.initializer}
    q = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert q and all(zero_points.get(n.input[2]) == fp8 for n in q if len(n.input) > 2)
    # ONNX Runtime's CPU provider cannot run this graph: the build says parity was not checked
    parity = json.loads((outcome.engine.parent / "parity.json").read_text())
    assert parity["checked"] is False and "ONNX Runtime cannot run" in parity["reason"]
