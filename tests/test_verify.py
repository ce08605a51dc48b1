"""enginekit verify: the parity gate on CPU (ONNX artifacts; engines need a GPU to run)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest

from conftest import assert_one_line_error
from test_build import DEPTH_PROFILE, YOLO_PROFILE

PROFILES = {"yolo12n": YOLO_PROFILE, "depth": DEPTH_PROFILE}


def verify(cache, model, precision, tmp_path, **kw):
    from enginekit import api

    return api.verify(model, precision=precision, cache=cache, quiet=True, report_dir=tmp_path / "report",
                      build_options={"profiles": [PROFILES[model]], "random_init": True}, **kw)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_verify_passes_and_writes_reports(cache, tmp_path, precision):
    """Depth-Anything on random weights (neck and head re-initialised: its depth spreads)."""
    outcome = verify(cache, "depth", precision, tmp_path)
    (report,) = outcome.reports
    assert outcome.passed, [str(c) for c in report.failures()]
    names = [a.name for a in report.artifacts]
    expected_stage = {"fp32": [], "fp16": ["onnx-fp16"], "int8": ["onnx-int8"]}[precision]
    assert names == ["onnx-export", "onnx-simplify", *expected_stage, "engine"]
    engine = report.artifacts[-1]
    assert engine.ran or engine.reason  # an engine that cannot run here says why; its source graph was checked
    final = report.artifacts[-2]
    assert {"abs_rel", "delta1"} <= set(final.task)
    assert final.task["compared"] > 0 and final.task["relative_spread"] > 0.01  # the reference has something to compare
    assert list(final.parts) == ["depth"] and final.parts["depth"]["worst"]["rel_l2"] > 0

    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["passed"] is True
    assert data["entries"][0]["artifacts"][-2]["parts"]["depth"]["limits"]["rel_l2"] > 0
    checks = sum(len(a.checks) for a in report.artifacts)
    skipped = [a for a in report.artifacts if not a.ran]
    root = ET.parse(tmp_path / "report" / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == checks + len(skipped)  # one per artifact x check, plus each skipped run
    assert len(root.findall(".//skipped")) == len(skipped) and not root.findall(".//failure")
    pngs = sorted((tmp_path / "report").glob("*.png"))
    assert len(pngs) >= len(names) - 1  # one per ONNX artifact (and the engine's where it ran)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "PASS" in summary and "| depth: depth (depth)" in summary and "abs_rel" in summary


def test_random_yolo_compares_nothing_and_fails(cache, tmp_path):
    """A random YOLO (as Ultralytics builds it) detects nothing at conf 0.25: its task check says it compares
    nothing, and fails (it used to pass with "precision 1, recall 1" on noise). Its parity parts are the
    anchor grid and one constant score; the comparison says so where two inputs share a shape (export and
    build parity, test_comparison_guard.py); here each photograph has its own rectangle."""
    outcome = verify(cache, "yolo12n", "fp32", tmp_path)
    (report,) = outcome.reports
    assert not outcome.passed
    failed = {c.name for c in report.failures()}
    assert failed and all("nothing to compare" in name for name in failed)
    assert any("no detections at conf 0.25" in name for name in failed)
    final = report.artifacts[-2]
    assert final.task["reference_detections"] == 0
    assert set(final.parts) == {"boxes", "scores"}
    assert "nothing to compare" in json.dumps(json.loads((tmp_path / "report" / "report.json").read_text()))


def test_second_verify_reuses_references(cache, tmp_path):
    first = verify(cache, "yolo12n", "fp32", tmp_path)
    second = verify(cache, "yolo12n", "fp32", tmp_path)
    assert second.reports[0].references_key == first.reports[0].references_key
    assert second.reports[0].references_status == "hit"
    ref_dir = cache.root / "reference" / first.reports[0].references_key
    assert (ref_dir / "inputs.json").is_file() and (ref_dir / "outputs.json").is_file()  # polygraphy formats


def test_require_engine_without_gpu_exits_3(run_cli, tmp_path):
    r = run_cli("verify", "yolo12n", "--random-init", "--profile", "1x3x256x256", "--require-engine",
                env={"ENGINEKIT_CACHE": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": ""})  # GPUs hidden
    assert_one_line_error(r, 3, "require-engine", "no GPU")


@pytest.fixture(scope="module")
def yolo_onnx_and_checkpoint(tmp_path_factory):
    """A random-init yolo12n checkpoint and its simplified ONNX (320x320)."""
    from enginekit import api
    from enginekit.cache import Cache
    from enginekit.families import resolve

    root = tmp_path_factory.mktemp("tamper")
    adapter = resolve("yolo12n")
    ckpt = root / "yolo12n-random.pt"
    adapter.save_checkpoint(adapter.load(None, random_init=True, seed=0), ckpt)
    result = api.export("yolo12n", weights=ckpt, input="1x3x320x320", output=root / "good.onnx",
                        cache=Cache(root / "cache"), quiet=True)
    return result.output, ckpt


def tamper_one_weight(src, dst, factor=50.0):
    model = onnx.load(str(src))
    # the bias of the head's last box convolution: a random YOLO's deep features are tiny, so
    # only a change near the output shows; a real model would show one anywhere
    floats = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    init = next((i for i in floats if i.name.endswith("cv2.0.2.bias")), floats[-1])
    arr = onnx.numpy_helper.to_array(init).copy()
    arr.flat[0] = arr.flat[0] * factor + 1.0
    init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    onnx.save(model, str(dst))


def test_any_onnx_of_random_weights_fails_for_want_of_detections(run_cli, tmp_path, yolo_onnx_and_checkpoint):
    """The ONNX computes what its checkpoint computes, but the photographs give a random YOLO
    nothing to detect: verify says so and fails (the trained detector passes: test_gates.py)."""
    good, ckpt = yolo_onnx_and_checkpoint
    r = run_cli("verify", str(good), "--reference", str(ckpt))
    assert_one_line_error(r, 1, "nothing to compare", "no detections at conf 0.25")


def test_tampered_onnx_fails_naming_the_part_and_metric(run_cli, tmp_path, yolo_onnx_and_checkpoint):
    """A change big enough to show on a random YOLO's boxes fails their statistics, and only theirs.
    (A random YOLO hides most tampers: the trained detector's test_a_tampered_weight_tensor_fails_parity in
    test_gates.py shows one.)"""
    good, ckpt = yolo_onnx_and_checkpoint
    bad = tmp_path / "tampered.onnx"
    tamper_one_weight(good, bad)
    r = run_cli("verify", str(bad), "--reference", str(ckpt), "--report", "rep")
    line = assert_one_line_error(r, 1, "parity boxes")
    assert "rel_l2" in line or "cosine" in line
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    failures = data["entries"][0]["failures"]
    assert data["passed"] is False and any("parity boxes rel_l2" in f or "parity boxes cosine" in f for f in failures)
    assert not any(f"parity scores {stat}" in f for f in failures for stat in ("finite", "rel_l2", "cosine", "max_abs"))
    optional = run_cli("verify", str(bad), "--reference", str(ckpt), "--task-optional")
    assert_one_line_error(optional, 1, "parity boxes")  # a difference fails even where comparing nothing is allowed


def test_verify_bad_inputs(run_cli, tmp_path, yolo_onnx_and_checkpoint):
    good, ckpt = yolo_onnx_and_checkpoint
    env = {"ENGINEKIT_CACHE": str(tmp_path / "cache")}
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_cli("verify", str(good), "--reference", str(ckpt), "--images", "empty", env=env),
                          2, "no images")
    assert_one_line_error(run_cli("verify", "abcdef0123", env=env), 2, "abcdef0123")
    # a Depth-Anything checkpoint given as the reference of a YOLO graph
    from enginekit.families import resolve

    depth = resolve("depth")
    depth_ckpt = tmp_path / "depth.pth"
    depth.save_checkpoint(depth.load(None, random_init=True, seed=0), depth_ckpt)
    r = run_cli("verify", str(good), "--reference", str(depth_ckpt), "--model", "depth", env=env)
    assert_one_line_error(r, 2, "does not match")


def test_repair_moves_few_nodes_and_passes(cache):
    """A tight FP16 tolerance fails with AutoCast's defaults; --repair finds the nodes to keep FP32."""
    from enginekit import api
    from enginekit.errors import ParityError  # noqa: F401 - a failed repair raises it

    outcome = api.build("depth", random_init=True, precision="fp16", profiles=["1x3x224x224"], repair=True,
                        tolerances=["rel_l2=1e-4"], cache=cache, quiet=True)
    record = outcome.manifest["repair"]
    assert record["rel_l2_before"] > 1e-4 >= record["rel_l2_after"]
    assert 0 < record["moved"] <= 32 and len(record["nodes"]) == record["moved"]
    assert outcome.manifest["precision"]["repaired_nodes"] == record["nodes"]
    fp16 = outcome.artifacts[-1]
    assert fp16.manifest["keep_fp32"] and any(n.strip("^$").replace("\\", "") in record["nodes"]
                                               for n in fp16.manifest["keep_fp32"])
    # the next --repair build starts from the nodes found: no search, same engine
    again = api.build("depth", random_init=True, precision="fp16", profiles=["1x3x224x224"], repair=True,
                      tolerances=["rel_l2=1e-4"], cache=cache, quiet=True)
    assert again.entry.key == outcome.entry.key


def test_verify_a_recipe(run_cli, tmp_path):
    """A recipe's cells are verified with its tolerances; a random YOLO fails for the right reason."""
    (tmp_path / "tiny.yaml").write_text(
        "model:\n  variant: yolo12n\n  random_init: true\nprofiles:\n  - 1x3x256x256\nprecisions: [fp32]\n"
    )
    r = run_cli("verify", "tiny.yaml", "--report", "rep", env={"ENGINEKIT_CACHE": str(tmp_path / "cache")})
    assert_one_line_error(r, 1, "nothing to compare")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert data["passed"] is False
    assert all("nothing to compare" in f for e in data["entries"] for f in e["failures"])


@pytest.mark.parametrize("needed,total", [(3, 100), (1, 10), (37, 200), (10, 10)])
def test_repair_search_finds_the_fewest_nodes_from_the_output(needed, total):
    from enginekit.compare.repair import repair

    names = [f"n{i}" for i in range(total)]
    need = set(names[-needed:])  # the last nodes before the output are the sensitive ones
    result = repair(lambda nodes: set(nodes), lambda a: (need <= a, 0.0 if need <= a else 1.0), names, None)
    assert set(result.nodes) == need
    assert result.trials <= 16


def test_repair_that_cannot_pass_says_so():
    from enginekit.errors import ParityError
    from enginekit.compare.repair import repair

    with pytest.raises(ParityError, match="even with all 8 candidate nodes moved"):
        repair(lambda nodes: nodes, lambda a: (False, 0.5), [f"n{i}" for i in range(8)], None)


@pytest.mark.gpu
def test_engine_runs_through_polygraphy_where_a_gpu_allows(cache, tmp_path):
    """Needs a GPU that the engine's backend supports (TensorRT-RTX: not compute capability 9.0), and a
    TensorRT builder installed."""
    from enginekit.errors import CapabilityError

    try:
        outcome = verify(cache, "depth", "fp16", tmp_path)
    except CapabilityError as exc:  # no TensorRT builder on this machine: there is no engine to run
        pytest.skip(str(exc))
    engine = outcome.reports[0].artifacts[-1]
    if not engine.ran:
        pytest.skip(f"the engine cannot run here: {engine.reason}")
    assert engine.passed, [str(c) for c in engine.checks if not c.passed]


def test_fp8_graph_that_cannot_run_here_fails_the_gate(cache, tmp_path, hide_gpu):
    """ONNX Runtime (CPU) cannot run FP8 Q/DQ graphs and no GPU is visible: nothing compared, so no pass."""
    from enginekit import api

    outcome = api.verify("yolo12n", precision="fp8", cache=cache, quiet=True,
                         build_options={"profiles": ["1x3x256x256"], "random_init": True, "target_cc": "8.9,12.0"})
    (report,) = outcome.reports
    fp8 = next(a for a in report.artifacts if a.name == "onnx-fp8")
    assert not outcome.passed and not fp8.ran and "ONNX Runtime cannot run it" in fp8.reason
    assert [c.name for c in fp8.checks] == ["runs on ONNX Runtime"] and not fp8.passed
