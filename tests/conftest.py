"""Shared fixtures. Tests run offline: no model hub, random weights saved and loaded back."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Set before any test imports ultralytics or transformers.
_ENV_ROOT = Path(os.environ.get("PYTEST_ENGINEKIT_TMP", "/tmp")) / f"enginekit-tests-{os.getpid()}"
os.environ["YOLO_OFFLINE"] = "1"
os.environ["YOLO_VERBOSE"] = "False"
os.environ.setdefault("YOLO_CONFIG_DIR", str(_ENV_ROOT / "ultralytics"))
os.environ["HF_HUB_OFFLINE"] = "1"  # fail fast instead of retrying an unreachable hub
os.environ["ENGINEKIT_CACHE"] = str(_ENV_ROOT / "cache")
# Parallel workers (pytest -n N) each get a core's share of PyTorch's threads (read when torch is imported): two
# workers of two OpenMP threads each on two cores wait on each other's spinning threads.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
# Each test process (the controller and every xdist worker) removes its own folder on exit: engines,
# graphs and Ultralytics' settings of one run add up to 1-2 GB, and runs would otherwise fill the disk.
atexit.register(shutil.rmtree, _ENV_ROOT, ignore_errors=True)


# --- capability markers: skip with the reason where the capability is missing, run where it is present ---


def _gpu_missing() -> str | None:
    """Why CUDA code cannot run here, or None. The engine backend's own fit is the test's to check."""
    try:
        import torch
    except ImportError:
        return "needs PyTorch with CUDA"
    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU that PyTorch can use (torch.cuda.is_available() is False)"
    return None


def _tensorrt_missing() -> str | None:
    try:
        import tensorrt  # noqa: F401  TensorRT proper (10/11), not tensorrt_rtx
    except Exception as exc:  # ImportError, or a wheel whose libraries do not load
        return f"needs TensorRT proper (import tensorrt: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    return None


_CAPABILITIES = {"gpu": _gpu_missing, "tensorrt": _tensorrt_missing}


def pytest_collection_modifyitems(config, items):
    answers: dict[str, str | None] = {}
    for item in items:
        for name, probe in _CAPABILITIES.items():
            if item.get_closest_marker(name) is None:
                continue
            if name not in answers:
                answers[name] = probe()  # asked once, and only when a collected test needs it
            if answers[name] is not None:
                item.add_marker(pytest.mark.skip(reason=answers[name]))


@pytest.fixture
def hide_gpu(monkeypatch):
    """The code paths of a machine without a GPU, on any machine (CUDA_VISIBLE_DEVICES hides them all)."""
    from enginekit.trt.flavours import gpu_info

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    gpu_info.cache_clear()
    yield
    gpu_info.cache_clear()


@pytest.fixture(scope="session")
def cache():
    from enginekit.cache import Cache

    return Cache(os.environ["ENGINEKIT_CACHE"])


@pytest.fixture(scope="session")
def trained_detector():
    """yolov8n trained by Ultralytics' trainer on generated coloured shapes (cached; see trained_detector.py).

    Returns a TrainedDetector: ``.weights`` (best.pt), ``.names``, ``.model`` (``"yolov8n"``).
    """
    from trained_detector import trained_detector as find_or_train

    return find_or_train()


@pytest.fixture(scope="session")
def detector_images(tmp_path_factory):
    """A folder for ``--images``: 8 generated held-out shape images (640x640) and Ultralytics' photographs."""
    from trained_detector import write_test_images

    return write_test_images(tmp_path_factory.mktemp("detector-images"))


@pytest.fixture(scope="session")
def yolo_export(tmp_path_factory, cache):
    """yolo12n, random weights, exported at 640 (FP32 and FP16)."""
    from enginekit import api

    out = tmp_path_factory.mktemp("yolo")
    return api.export("yolo12n", random_init=True, fp16=True, output=out / "yolo12n.fp16.onnx", cache=cache,
                      quiet=True)


@pytest.fixture(scope="session")
def depth_export(tmp_path_factory, cache):
    """Depth-Anything-V2-small, random weights, exported at 518 (dynamic batch and H/W)."""
    from enginekit import api

    out = tmp_path_factory.mktemp("depth")
    return api.export("depth", random_init=True, input="1x3x518x518", output=out / "depth.onnx", cache=cache,
                      quiet=True)


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 900) -> CliResult:
    """``enginekit ARGS`` in a fresh process, as a user runs it. Every ``verify`` the suite runs also writes JUnit
    (to a file of its own where the test asked for none), and its verdict is held to one rule: the exit code, the
    JUnit result and the printed gate column say the same (``assert_verdicts_agree``)."""
    import tempfile

    args = [str(a) for a in args]
    junit = None
    if args[:1] == ["verify"] and "--help" not in args:
        if "--junit" in args:
            junit = Path(cwd) / args[args.index("--junit") + 1]
        else:
            junit = Path(tempfile.mkdtemp(prefix="verdict-", dir=_ENV_ROOT if _ENV_ROOT.is_dir() else None)) / "v.xml"
            args += ["--junit", str(junit)]
    full_env = dict(os.environ, COLUMNS="200")
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "enginekit", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    result = CliResult(proc)
    if junit is not None:
        assert_verdicts_agree(result, junit)
    return result


def assert_verdicts_agree(result: CliResult, junit: Path) -> None:
    """A verdict (exit 0 or 1) is one verdict: exit 1 exactly when JUnit counts a failure, and where the ladder
    table is printed (``--data``), exactly when a row's gate says FAIL. Refusals (2, 3) write no verdict."""
    import re
    import xml.etree.ElementTree as ET

    if result.code not in (0, 1) or not junit.is_file():
        return
    root = ET.parse(junit).getroot()
    failed = sum(int(s.get("failures") or 0) + int(s.get("errors") or 0) for s in root.iter("testsuite"))
    assert (result.code == 1) == (failed > 0), (f"exit {result.code} but JUnit counts {failed} failure(s)",
                                                result.stderr[-2000:])
    rows = [line for line in result.stderr.splitlines() if re.search(r"\b(pass|FAIL)\b \(", line)]
    if rows:
        assert (result.code == 1) == any("FAIL" in r for r in rows), (f"exit {result.code}; the table's gates:",
                                                                     rows, result.stderr[-2000:])


@pytest.fixture
def run_cli(tmp_path):
    """Run ``enginekit ARGS`` as a user would, in a fresh process, from tmp_path (verdicts held to one rule)."""

    def run(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 600) -> CliResult:
        return cli(*args, cwd=cwd or tmp_path, env=env, timeout=timeout)

    return run


def assert_one_line_error(result: CliResult, code: int, *needles: str) -> str:
    assert result.code == code, (result.code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.error_lines if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def varied_depth_weights(folder: Path) -> Path:
    """Depth-Anything-V2-small with every layer at PyTorch's default init, saved in ``folder``: a depth
    map that varies (transformers' own init of the random model can give a constant map)."""
    import torch

    from enginekit.families import resolve

    adapter = resolve("depth")
    loaded = adapter.load(None, random_init=True, seed=0)
    torch.manual_seed(0)
    for layer in loaded.module.modules():
        if hasattr(layer, "reset_parameters") and layer is not loaded.module:
            layer.reset_parameters()
    # the head ends in a ReLU: a random head whose last bias lands negative gives an all-zero map
    loaded.module.model.head.conv3.bias.data.fill_(1.0)
    path = folder / "depth.safetensors"
    adapter.save_checkpoint(loaded, path)
    return path
