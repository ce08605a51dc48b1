"""The flows a user types, end to end on the suite's trained detector.

export a model to ONNX, build that file, verify by model name and weights; verify an exported ONNX
by its metadata; every build flag that changes the engine is one verify accepts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_one_line_error

SIZE = "1x3x320x320"  # the trained detector exports at 640 by default; 320 keeps the suite quick


@pytest.fixture(scope="module")
def exported(trained_detector, tmp_path_factory, run_cli_module):
    folder = tmp_path_factory.mktemp("flows")
    r = run_cli_module(folder, "export", "yolov8n", "--weights", str(trained_detector.weights), "--input", SIZE,
                       "-o", "m.onnx")
    assert r.code == 0, r.stderr
    return folder / "m.onnx"


@pytest.fixture(scope="module")
def run_cli_module():
    from conftest import cli

    def run(cwd: Path, *args: str) -> CliResult:
        return cli(*args, cwd=cwd)

    return run


def test_build_from_exported_onnx_then_verify_by_model_and_weights(exported, trained_detector, run_cli, tmp_path):
    built = run_cli("build", str(exported), "--precision", "int8", "--profile", SIZE)
    assert built.code == 0, built.stderr
    engine_key = Path(built.stdout.strip().splitlines()[-1]).parent.name
    manifest = json.loads((Path(built.stdout.strip().splitlines()[-1]).parent / "manifest.json").read_text())
    assert manifest["source_model"]["name"] == "yolov8n"
    assert manifest["source_model"]["weights"].startswith("sha256:")

    r = run_cli("verify", "yolov8n", "--weights", str(trained_detector.weights), "--precision", "int8",
                "--profile", SIZE, "--report", "rep")
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    # verified, not refused: the INT8 gate decides, and the exit code says what the report says
    assert r.code == (0 if report["passed"] else 1), (r.code, r.stderr)
    entry = report["entries"][0]
    assert entry["engine_key"] == engine_key  # the very engine the file build made
    stages = {a["name"]: a for a in entry["artifacts"]}
    assert {"onnx-export", "onnx-simplify", "onnx-int8"} <= set(stages)
    assert all(a["ran"] for name, a in stages.items() if name.startswith("onnx")), stages


def test_verify_exported_onnx_by_its_metadata(exported, trained_detector, run_cli):
    r = run_cli("verify", str(exported), "--weights", str(trained_detector.weights))
    assert r.code == 0, r.stderr
    # other weights than the metadata's: one line, exit 2
    assert_one_line_error(run_cli("verify", str(exported), "--random-init"), 2, "is not what m.onnx was exported")
    # no weights at all: the metadata names a checkpoint, which must be given
    assert_one_line_error(run_cli("verify", str(exported)), 2, "--weights")


def test_random_init_onnx_needs_no_flags():
    """Seeded random weights are reproducible: the metadata alone says how to rebuild the reference."""
    from enginekit.verification.checks import onnx_model_request
    from enginekit.errors import UsageError

    meta = {"model": "yolov8n", "weights": "random:yolov8n.yaml@7"}
    request = onnx_model_request(Path("r.onnx"), meta, None, None, None)
    assert request.random_init and request.seed == 7
    from enginekit.requests import BuildRequest

    with pytest.raises(UsageError, match="seed 3"):
        onnx_model_request(Path("r.onnx"), meta, None, None, BuildRequest(target="r.onnx", random_init=True, seed=3))
    with pytest.raises(UsageError, match="does not say which model"):
        onnx_model_request(Path("x.onnx"), {}, None, None, None)


def _params(command: str) -> set[str]:
    import typer.main

    from enginekit.cli import app

    click_app = typer.main.get_command(app)
    return {p.name for p in click_app.commands[command].params}


def test_every_build_flag_that_changes_the_engine_is_a_verify_flag():
    not_the_engine = {"target", "output", "no_verify", "explain", "force", "ultralytics_metadata",
                      "as_json", "accept_failed"}  # a copy, a way of printing, or of recording, not the engine
    missing = _params("build") - not_the_engine - _params("verify")
    assert not missing, f"verify cannot find engines built with {sorted(missing)}"


def test_verify_request_carries_every_build_option():
    from enginekit.requests import VerifyRequest

    options = {"profiles": ["1x3x320x320"], "flavour": "tensorrt-rtx", "target_cc": "8.6", "workspace": "1G",
               "opt_level": 2, "calib_count": 4, "calib_method": "max", "exclude": ["/model.22/.*"],
               "repair": True, "tolerances": ["rel_l2=0.1"], "random_init": True, "seed": 3}
    request = VerifyRequest(target="yolov8n", precision="int8", build_options=options)
    built = request.build_request
    for name, value in options.items():
        got = getattr(built, name)
        assert (got.items() if name == "tolerances" else got) == value, name


def test_depth_builds_and_verifies_at_384(run_cli, tmp_path):
    """384 is not a multiple of 14: the graph resizes to 392 itself and returns depth at 384."""
    r = run_cli("build", "depth", "--random-init", "--profile", "1x3x384x384")
    assert r.code == 0, r.stderr
    engine = Path(r.stdout.strip().splitlines()[-1])
    manifest = json.loads((engine.parent / "manifest.json").read_text())
    assert "multiple of 14" in manifest["input_sizes"]
    v = run_cli("verify", "depth", "--random-init", "--profile", "1x3x384x384", "--image-count", "2")
    assert v.code == 0, v.stdout + v.stderr


def test_depth_at_384_matches_the_reference_pipeline(tmp_path):
    """The exported graph at 384 against the original pipeline in PyTorch (photograph resized to 392,
    run, depth bilinear back to 384); the floor the patch embedding does alone is 5x further."""
    import cv2
    import numpy as np
    import onnxruntime as ort
    import torch
    import torch.nn.functional as F

    from enginekit.cache import Cache
    from enginekit.families import resolve
    from enginekit.images import embedded_image_paths
    from enginekit.pipeline import ModelRequest, Stages

    pipe = Stages(ModelRequest("depth", None, True, 0), Cache(tmp_path / "cache"))
    onnx_path = pipe.export((1, 3, 518, 518), 18).path
    adapter = resolve("depth")
    wrapped = pipe.loaded.module
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    image = cv2.imread(str(embedded_image_paths()[0]))[..., ::-1]
    x = adapter.preprocess(image, (384, 384))
    got = session.run(None, {"pixel_values": x})[0]
    assert got.shape == (1, 384, 384)
    with torch.no_grad():
        at392 = wrapped(torch.from_numpy(adapter.preprocess(image, (392, 392))))  # a multiple of 14: no resize
        ref = F.interpolate(at392[:, None], size=(384, 384), mode="bilinear", align_corners=True)[:, 0].numpy()
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    assert rel < 0.03, rel
