"""enginekit verify: the parity gate on CPU (ONNX artifacts; engines need a GPU to run)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from conftest import assert_one_line_error
from test_build import DEPTH_PROFILE, YOLO_PROFILE

PROFILES = {"yolo12n": YOLO_PROFILE, "depth": DEPTH_PROFILE}


def verify(cache, model, precision, tmp_path, **kw):
    from enginekit import api

    return api.verify(model, precision=precision, cache=cache, quiet=True, report_dir=tmp_path / "report",
                      build_options={"profiles": [PROFILES[model]], "random_init": True}, **kw)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_verify_passes_and_writes_reports(cache, tmp_path, precision):
    """Plumbing: the chain verify walks and the reports it writes (JSON, JUnit, pictures, summary), on
    Depth-Anything's random weights. Their depth spreads only 5-8% around its mean, so a pass here shows no
    accuracy (the map replaced by its mean passes INT8's limits): INT8 depth is gated where it can fail, on the
    suite's trained depth model (test_dense_tasks.py: domain calibration passes, noise calibration fails)."""
    outcome = verify(cache, "depth", precision, tmp_path)
    (report,) = outcome.reports
    assert outcome.passed, [str(c) for c in report.failures()]
    names = [a.name for a in report.artifacts]
    expected_stage = {"fp32": [], "fp16": ["onnx-fp16"]}[precision]
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


def test_random_yolo_is_informative_and_passes(cache, tmp_path):
    """``--random-init`` YOLO weights depend on the image (families/random_init.py): its boxes and
    scores are gated as a trained detector's are, on detections it finds at conf 0.25 (as Ultralytics builds
    it, it found none and this verify failed with "nothing to compare")."""
    outcome = verify(cache, "yolo12n", "fp32", tmp_path)
    (report,) = outcome.reports
    assert outcome.passed, [str(c) for c in report.failures()]
    final = report.artifacts[-2]
    assert final.task["reference_detections"] >= 16 and final.task["recall"] == 1.0
    assert set(final.parts) == {"boxes", "scores"}
    assert not any(p.get("constant") for p in final.parts.values())
    assert {"parity boxes rel_l2", "parity scores rel_l2"} <= {c.name for c in final.checks}
    assert "nothing to compare" not in json.dumps(json.loads((tmp_path / "report" / "report.json").read_text()))


def test_second_verify_reuses_references(cache, tmp_path):
    first = verify(cache, "yolo12n", "fp32", tmp_path)
    second = verify(cache, "yolo12n", "fp32", tmp_path)
    assert second.reports[0].references_key == first.reports[0].references_key
    assert second.reports[0].references_status == "hit"
    ref_dir = cache.root / "reference" / first.reports[0].references_key
    assert (ref_dir / "inputs.json").is_file() and (ref_dir / "outputs.json").is_file()  # polygraphy formats


def test_a_stored_verdict_is_the_verdict_it_stored(cache, tmp_path):
    """A second verify of the same content runs no comparison: each graph's report comes from the stored verdict,
    figures that JSON cannot hold (an infinite PSNR of identical outputs, NaN) included, and the reports render."""
    import math

    first = verify(cache, "yolo12n", "fp32", tmp_path / "a")
    second = verify(cache, "yolo12n", "fp32", tmp_path / "b")
    a, b = first.reports[0].artifacts, second.reports[0].artifacts
    assert [x.name for x in a] == [x.name for x in b] and second.passed == first.passed
    for x, y in zip(a, b):
        assert x.task == y.task and [c.name for c in x.checks] == [c.name for c in y.checks]
        for part in x.parts:
            for stat, value in x.parts[part]["worst"].items():
                other = y.parts[part]["worst"][stat]
                assert (math.isnan(value) and math.isnan(other)) or value == other, (part, stat, value, other)
    summary = (tmp_path / "b" / "report" / "summary.md").read_text()
    assert "onnx-simplify" in summary and "None" not in summary


def test_require_engine_without_gpu_exits_3(run_cli, tmp_path):
    env = {"ENGINEKIT_CACHE": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": ""}  # GPUs hidden
    # verify builds no engine: where build made none, the engine that must run is not there, said so
    none = run_cli("verify", "yolo12n", "--random-init", "--profile", "1x3x256x256", "--require-engine", env=env)
    assert_one_line_error(none, 3, "require-engine", "no engine built")
    assert run_cli("build", "yolo12n", "--random-init", "--profile", "1x3x256x256", env=env).code == 0
    r = run_cli("verify", "yolo12n", "--random-init", "--profile", "1x3x256x256", "--require-engine", env=env)
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


def test_an_onnx_of_random_weights_passes(run_cli, tmp_path, yolo_onnx_and_checkpoint):
    """The ONNX computes what its checkpoint computes, on detections the informative random weights find."""
    good, ckpt = yolo_onnx_and_checkpoint
    r = run_cli("verify", str(good), "--reference", str(ckpt), "--report", "rep")
    assert r.code == 0, r.stderr
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert data["passed"] is True and data["entries"][0]["artifacts"][0]["task"]["reference_detections"] >= 16


def test_tampered_random_yolo_onnx_fails_parity(run_cli, tmp_path, yolo_onnx_and_checkpoint):
    """A tenth of the largest weight tensor multiplied by -3 (which left a plain random YOLO's figures as they
    were): verify fails on the parity of both parts, not only on the task, each photograph letterboxed to its
    own rectangle; --task-optional fails it too."""
    from test_gates import scale_largest_weight

    good, ckpt = yolo_onnx_and_checkpoint
    bad = scale_largest_weight(good, tmp_path / "tampered.onnx")
    r = run_cli("verify", str(bad), "--reference", str(ckpt), "--report", "rep")
    line = assert_one_line_error(r, 1, "parity boxes")
    assert "rel_l2" in line or "cosine" in line
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    failures = data["entries"][0]["failures"]
    assert data["passed"] is False
    for part in ("boxes", "scores"):
        assert any(f"parity {part} rel_l2" in f for f in failures), failures
    assert not any("nothing to compare" in f for f in failures)
    optional = run_cli("verify", str(bad), "--reference", str(ckpt), "--task-optional")
    assert_one_line_error(optional, 1, "parity boxes")


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
    """A recipe's cells are verified with its tolerances: the same cell passes with the family's limits and
    fails with the recipe's rel_l2 limit, naming it."""
    recipe = "model:\n  variant: yolo12n\n  random_init: true\nprofiles:\n  - 1x3x256x256\nprecisions: [fp32]\n"
    (tmp_path / "tiny.yaml").write_text(recipe)
    env = {"ENGINEKIT_CACHE": str(tmp_path / "cache")}
    r = run_cli("verify", "tiny.yaml", "--report", "ok", env=env)
    assert r.code == 0, r.stderr
    (tmp_path / "tight.yaml").write_text(recipe + "verification:\n  tolerances:\n    fp32:\n      rel_l2: 1.0e-12\n")
    r = run_cli("verify", "tight.yaml", "--report", "rep", env=env)
    assert_one_line_error(r, 1, "rel_l2")
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert data["passed"] is False
    failures = [f for e in data["entries"] for f in e["failures"]]
    assert failures and all("rel_l2" in f and "1e-12" in f for f in failures), failures


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
    assert [c.name for c in fp8.checks] == ["does not run on ONNX Runtime"] and not fp8.passed
