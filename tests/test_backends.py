"""Backends: one protocol, one registry, and every verb offers what is registered.

A tiny backend (an ONNX graph through ONNX Runtime's CPU provider under another name, plus a variant
that needs a GPU) is registered in this process; bench, predict and doctor, run through the CLI in
this process, offer it. The runtime only loads; ``enginekit.load`` makes what a model name needs.
The backend choice and "which TensorRT runs this engine" are checked on machines described to them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from enginekit.backends import ONNX, Backend, SessionInfo, Verdict, registry
from enginekit.backends.base import DETECT, detect_gpu, static

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


class Tiny(Backend):
    """The whole of a new backend: what it runs, whether it runs here, and activate/infer."""

    name = "tiny"
    label = "the tiny backend"
    runs = (ONNX,)
    needs = "onnxruntime"

    @classmethod
    def variants(cls):
        return {"tiny-cpu": {}, "tiny-gpu": {"gpu_only": True}}

    @classmethod
    def check(cls, artifact=None, *, device=None, gpu=DETECT, gpu_only=False, **options) -> Verdict:
        if gpu_only and detect_gpu(gpu) is None:
            return Verdict(False, "tiny-gpu wants a GPU, and this machine has none")
        return Verdict(True, "tiny runs anywhere")

    def _activate(self) -> None:
        from enginekit.onnx.runtime import session

        self.session = session(self.artifact.path)
        (inp,) = self.session.get_inputs()
        self.info = SessionInfo(self.name, "cpu", inp.name, tuple(o.name for o in self.session.get_outputs()),
                                static(inp.shape))

    def infer(self, x):
        from enginekit.onnx.runtime import run

        return run(self.session, {self.info.input_name: np.ascontiguousarray(x, dtype=np.float32)})


@pytest.fixture
def tiny():
    registry.register(Tiny)
    try:
        yield Tiny
    finally:
        registry.unregister(Tiny.name)


def invoke(*args: str, env: dict | None = None):
    """``enginekit ARGS`` in this process (so what this process registered is there)."""
    from typer.testing import CliRunner

    from enginekit.cli import app

    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **NO_GPU, **(env or {})})
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    import cv2

    from enginekit.images import embedded_image_paths

    bus = next(p for p in embedded_image_paths() if p.name == "bus.jpg")
    path = tmp_path_factory.mktemp("backends-photo") / "bus.png"
    cv2.imwrite(str(path), cv2.resize(cv2.imread(str(bus)), (180, 240), interpolation=cv2.INTER_AREA))
    return path


# --- a registered backend, offered by every verb -------------------------------------------------------


def test_bench_times_a_registered_backend_and_skips_its_variant_that_cannot_run(tiny, tmp_path):
    result = invoke("bench", "yolo12n", "--random-init", "--input", "224x224", "--backend", "tiny,onnxruntime-cpu",
                    "--warmup", "1", "--iters", "3", "--e2e", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    rows = {r["backend"]: r for r in report["results"]}
    assert list(rows) == ["onnxruntime-cpu", "tiny-cpu", "tiny-gpu"]  # the registry's order
    ok = rows["tiny-cpu"]
    assert ok["status"] == "ok" and ok["device"] == "cpu" and ok["timer"] == "perf_counter", ok
    assert 0 < ok["latency_ms"]["p50"] <= ok["latency_ms"]["p99"] and ok["throughput_ips"] > 0
    assert rows["tiny-gpu"]["status"] == "skipped" and rows["tiny-gpu"]["reason"] == (
        "tiny-gpu wants a GPU, and this machine has none")
    e2e = {r["backend"]: r for r in report["end_to_end"]["results"]}
    assert e2e["tiny-cpu"]["status"] == "ok" and e2e["tiny-cpu"]["runtime"] == "tiny", e2e["tiny-cpu"]
    assert e2e["tiny-gpu"]["status"] == "skipped"


def test_predict_runs_a_registered_backend_as_onnxruntime_cpu_does(tiny, tmp_path, photo):
    """A model name on the tiny backend: exported through the cache, then loaded; the same detections."""
    saved = {}
    for backend in ("tiny", "onnxruntime-cpu"):
        out = tmp_path / backend
        result = invoke("predict", "yolo12n", str(photo), "--random-init", "--backend", backend, "--conf", "0.0001",
                        "--save", str(out))
        assert result.exit_code == 0, result.stderr
        saved[backend] = json.loads((out / "results.json").read_text())
    assert saved["tiny"]["models"][0]["backend"] == "tiny" and saved["tiny"]["models"][0]["reason"].startswith("asked for")
    mine, theirs = (saved[b]["frames"][0]["results"]["yolo12n"]["detections"] for b in ("tiny", "onnxruntime-cpu"))
    assert mine and mine == theirs


def test_doctor_lists_a_registered_backend_and_whether_it_runs_here(tiny):
    result = invoke("doctor", "--json")
    assert result.exit_code == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)["backends"]}
    assert rows["tiny"]["can_run"] is True and rows["tiny"]["reason"] == "tiny runs anywhere"
    assert list(rows)[-1] == "tiny" and "onnxruntime-cpu" in rows  # beside the built-in ones
    table = invoke("doctor")
    assert table.exit_code == 0 and "tiny runs anywhere" in table.stdout


def test_unknown_backend_names_every_registered_one(tiny, photo):
    result = invoke("predict", "yolo12n", str(photo), "--random-init", "--backend", "nosuch")
    assert result.exit_code == 2
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert "unknown backend 'nosuch'" in line and "tiny" in line and "onnxruntime-cuda" in line
    result = invoke("bench", "yolo12n", "--random-init", "--backend", "nosuch")
    assert result.exit_code == 2 and "tiny-gpu" in result.stderr


# --- the runtime loads, the API layer makes ----------------------------------------------------------


def test_the_runtime_only_loads_and_enginekit_load_makes_the_graph(tiny, tmp_path):
    """runtime.load refuses a model name whose backend runs graphs (and makes nothing); enginekit.load exports
    it; both then run the graph, and ``auto`` passes over a backend with no rank."""
    import enginekit
    from enginekit.cache import Cache
    from enginekit.errors import UsageError
    from enginekit.runtime import load

    empty = Cache(tmp_path / "cache")
    with pytest.raises(UsageError, match="enginekit.load exports or builds it"):
        load("yolo12n", random_init=True, backend="tiny", cache=empty)
    assert not (tmp_path / "cache").exists() or not empty.ls()
    made = enginekit.load("yolo12n", random_init=True, backend="tiny")
    assert made.backend == "tiny" and made.source.endswith("model.onnx")
    graph = Path(made.source)
    ours = load(graph, backend="tiny")
    auto = load(graph, device="cpu")
    assert ours.backend == "tiny" and auto.backend == "onnxruntime-cpu" and auto.reason.startswith("ONNX Runtime on the CPU")
    x = np.random.default_rng(0).random((1, 3, 640, 640), dtype=np.float32)
    a, b = ours.session(x), auto.session(x)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert np.abs(a["output0"]).max() > 0  # it compared outputs, not two empty dicts


# --- the choice of backend, on machines described to it ---------------------------------------------------


@pytest.fixture
def pretend_gpu(monkeypatch):
    """Make enginekit believe this machine has the given GPU (nothing runs on it here)."""
    import enginekit.gpu
    from enginekit.gpu import GpuInfo

    pytest.importorskip("tensorrt_rtx", reason="the TensorRT-RTX wheels are not installed")

    def pretend(name: str, cc: str) -> GpuInfo:
        gpu = GpuInfo(name, cc)
        monkeypatch.setattr(enginekit.gpu, "gpus", lambda: (gpu,))
        return gpu

    return pretend


def _model_target():
    from enginekit.model import ModelRequest
    from enginekit.runtime.loader import Target

    return Target("model", "yolo12n", "yolo12n", request=ModelRequest("yolo12n", random_init=True))


def test_auto_takes_tensorrt_rtx_where_it_runs(pretend_gpu):
    from enginekit.runtime.loader import choose_backend

    pretend_gpu("NVIDIA GeForce RTX 4090", "8.9")
    backend, reason = choose_backend(_model_target(), "auto", None)
    assert backend.name == "tensorrt" and "TensorRT-RTX" in reason and "RTX 4090" in reason


def test_auto_on_hopper_says_tensorrt_rtx_refuses_9_0_and_falls_back(pretend_gpu):
    """No TensorRT proper, TensorRT-RTX refuses compute capability 9.0, ONNX Runtime's CUDA provider and
    torch find no driver here: ONNX Runtime on the CPU, and the reason names each refusal."""
    from enginekit.runtime.loader import choose_backend

    pretend_gpu("NVIDIA H100 80GB HBM3", "9.0")
    backend, reason = choose_backend(_model_target(), "auto", None)
    assert backend.name == "onnxruntime-cpu", reason
    assert "TensorRT: TensorRT-RTX" in reason and "does not run on compute capability 9.0" in reason
    assert reason.endswith("ONNX Runtime on the CPU") and "PyTorch:" in reason


def test_an_engine_runs_on_tensorrt_only():
    from enginekit.errors import UsageError
    from enginekit.runtime.loader import Target, choose_backend

    engine = Target("engine", "engine.plan", "yolo12n")
    backend, reason = choose_backend(engine, "auto", None)
    assert backend.name == "tensorrt" and reason == "an engine plan runs on TensorRT"
    with pytest.raises(UsageError, match="runs on the tensorrt backend only"):
        choose_backend(engine, "onnxruntime-cpu", None)


def test_which_tensorrt_runs_an_engine_is_answered_once():
    """With a manifest: the engine's own TensorRT and targets; without: what a build here would make."""
    pytest.importorskip("tensorrt_rtx", reason="the TensorRT-RTX wheels are not installed")
    from enginekit.gpu import GpuInfo
    from enginekit.trt.flavours import resolve_flavour
    from enginekit.trt.session import engine_runs_here

    rtx = resolve_flavour("tensorrt-rtx")
    hopper, ada = GpuInfo("NVIDIA H100 80GB HBM3", "9.0"), GpuInfo("NVIDIA GeForce RTX 4090", "8.9")
    built = {"backend": "tensorrt-rtx", "backend_version": rtx.version, "targets": ["8.6", "8.9"]}
    assert engine_runs_here(built, gpu=ada).ok and engine_runs_here(built, gpu=ada).flavour.name == "tensorrt-rtx"
    on_hopper = engine_runs_here(built, gpu=hopper)
    assert not on_hopper.ok and "is not among them" in on_hopper.reason
    older = engine_runs_here({**built, "backend_version": "1.0.0.1"}, gpu=ada)
    assert not older.ok and "rebuild it with this one" in older.reason
    assert not engine_runs_here(built, gpu=None).ok
    planned = engine_runs_here(flavour="tensorrt-rtx", gpu=hopper)
    assert not planned.ok and "does not run on compute capability 9.0" in planned.reason
    assert engine_runs_here(flavour="tensorrt-rtx", gpu=ada).ok
    assert "no GPU" in engine_runs_here(flavour="tensorrt-rtx", gpu=None).reason
