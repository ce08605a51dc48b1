"""Every Python file in examples/ runs as a user would run it, on a cache of its own.

examples/python_api.py runs in its second form, on a trained detector (`python_api.py yolov8n best.pt`, the
suite's): its gates compare detections that mean something, and the first form's model (a random-weight
Depth-Anything) is exported, built and verified by test_build.py, test_export.py and test_flows.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(EXAMPLES.rglob("*.py"))


def run_example(path: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ENGINEKIT_CACHE=str(tmp_path / "cache"), TMPDIR=str(tmp_path), YOLO_OFFLINE="1",
               YOLO_VERBOSE="False", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, str(path), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)


def test_there_are_examples():
    assert SCRIPTS, "examples/ holds no Python file"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_runs(path, tmp_path, request):
    args = ()
    if path.name == "python_api.py":
        from trained_detector import write_held_out_images

        trained = request.getfixturevalue("trained_detector")
        images = write_held_out_images(tmp_path / "images", count=20, size=320)  # about 100 detections
        args = (trained.model, str(trained.weights), str(images))
    done = run_example(path, tmp_path, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    if path.name == "python_api.py":
        lines = done.stdout.splitlines()
        # its three results: the ONNX written, the engine built, each artifact's gate
        (export,) = [line for line in lines if line.startswith("export:")]
        assert "passed=True" in export and Path(export.split()[1]).is_file()
        (build,) = [line for line in lines if line.startswith("build:")]
        engine = Path(build.split()[1])
        assert engine.is_file() and engine.is_relative_to(tmp_path / "cache")
        verified = [line for line in lines if line.startswith("verify:")]
        assert {line.split()[1] for line in verified} >= {"onnx-export", "onnx-simplify", "onnx-fp16", "engine"}
        assert all(line.split()[2] in ("pass", "skipped:") for line in verified), verified
        # the library printed nothing of its own: every line is one of the example's
        assert all(line.split(":")[0] in ("export", "build", "verify", "reports") for line in lines), lines
