"""enginekit.trt: backend table, targets, strongly typed builds through TensorRT-RTX.

TensorRT-RTX builds ahead of time without a GPU, so every build here runs on any machine
with the tensorrt-rtx wheels. Tests that need TensorRT proper carry ``@pytest.mark.tensorrt``.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from enginekit.errors import CapabilityError, UsageError
from enginekit.shapes import InputRange, parse_profile
from enginekit.trt import builder, flavours
from enginekit.trt.binding import bind, trt_logger
from enginekit.trt.flavours import (
    PORTABLE_RTX_TARGETS,
    TRAITS,
    Flavour,
    GpuInfo,
    default_targets,
    fp8_supported,
    require_fp8,
    resolve_flavour,
    validate_targets,
)
from enginekit.trt.builder import BuildOptions, BuiltFor, build_engine, can_run_here

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

trt_rtx = pytest.importorskip("tensorrt_rtx", reason="the TensorRT-RTX wheels are not installed")

NEEDS_TENSORRT = "needs TensorRT proper (tensorrt 10/11): pip install tensorrt-cu13"
DYNAMIC = "1x3x16x16:2x3x16x16:4x3x16x16"
RTX_GPU = GpuInfo("NVIDIA GeForce RTX 4090", "8.9")


# --- hand-made ONNX models -----------------------------------------------------------


def _save(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what ONNX Runtime accepts; newer onnx writes a newer one by default
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _weights(name: str, dtype=np.float32) -> onnx.TensorProto:
    rng = np.random.default_rng(0)
    return numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(dtype), name)


def conv_relu(path: Path, batch: str | int = "N") -> Path:
    """x[N,3,16,16] fp32 -> Conv(4) -> Relu -> y."""
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 16, 16])],
        [_weights("W")],
    )
    return _save(graph, path)


def conv_fp16(path: Path) -> Path:
    """x fp32 -> Cast fp16 -> Conv (fp16 weights) -> Relu -> y fp16: precision in the graph."""
    nodes = [
        helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16),
        helper.make_node("Conv", ["xh", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_fp16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["N", 4, 16, 16])],
        [_weights("W", np.float16)],
    )
    return _save(graph, path)


def conv_fp8(path: Path) -> Path:
    """FP8 Q/DQ on input and weights before a Conv (needs compute capability 8.9+)."""
    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "s")
    zero = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0])
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s"], ["xd"]),
        helper.make_node("QuantizeLinear", ["W", "s", "z"], ["wq"]),
        helper.make_node("DequantizeLinear", ["wq", "s"], ["wd"]),
        helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_fp8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16, 16])],
        [_weights("W"), scale, zero],
    )
    return _save(graph, path, opset=19)  # FP8 Q/DQ needs opset 19


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("onnx")
    return {
        "dynamic": conv_relu(root / "dynamic.onnx"),
        "static": conv_relu(root / "static.onnx", batch=2),
        "fp16": conv_fp16(root / "fp16.onnx"),
        "fp8": conv_fp8(root / "fp8.onnx"),
    }


@pytest.fixture(scope="module")
def rtx() -> Flavour:
    return resolve_flavour("tensorrt-rtx")


@pytest.fixture
def no_gpu(monkeypatch):
    """Make the machine look GPU-less, whatever it has."""
    monkeypatch.setattr(flavours, "gpu_info", lambda: None)
    monkeypatch.setattr(builder, "gpu_info", lambda: None)


@pytest.fixture
def fake_tensorrt(monkeypatch):
    """Install a stand-in ``tensorrt`` module of a chosen version (no GPU code runs)."""

    def install(version: str | None) -> None:
        if version is None:
            monkeypatch.setitem(sys.modules, "tensorrt", None)  # import raises ImportError
            return
        module = types.ModuleType("tensorrt")
        module.__version__ = version
        monkeypatch.setitem(sys.modules, "tensorrt", module)

    return install


# --- builds through TensorRT-RTX -----------------------------------------------------


def test_build_dynamic_conv_relu(models, rtx, no_gpu):
    messages: list[str] = []
    result = build_engine(models["dynamic"], [parse_profile(DYNAMIC)], rtx, progress=messages.append)
    assert len(result.plan) > 1000
    assert result.plan[:1] != b"{"  # raw plan, no JSON header in front
    assert result.io == [
        {"name": "x", "mode": "input", "dtype": "float32", "shape": [-1, 3, 16, 16]},
        {"name": "y", "mode": "output", "dtype": "float32", "shape": [-1, 4, 16, 16]},
    ]
    assert (result.backend, result.backend_version) == ("tensorrt-rtx", rtx.version)
    assert result.targets == PORTABLE_RTX_TARGETS
    assert result.profiles[0].inputs["x"] == InputRange((1, 3, 16, 16), (2, 3, 16, 16), (4, 3, 16, 16))
    assert any("building with TensorRT-RTX" in m for m in messages)
    assert any(m.strip() == "Building engine" for m in messages)  # from the progress monitor
    assert result.to_json()["plan_bytes"] == len(result.plan)


def test_fp16_cast_keeps_graph_types(models, rtx):
    result = build_engine(models["fp16"], [parse_profile(DYNAMIC)], rtx, BuildOptions(target_cc=("8.6",)))
    dtypes = {t["name"]: t["dtype"] for t in result.io}
    assert dtypes == {"x": "float32", "y": "float16"}
    assert result.targets == ("8.6",)


def test_network_is_strongly_typed(models, rtx):
    _builder, net, _parser = builder.network_loader(bind(rtx), rtx, models["static"])()
    assert net.get_flag(trt_rtx.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def test_several_profiles(models, rtx):
    profiles = [parse_profile("1x3x16x16"), parse_profile("2x3x16x16:4x3x16x16:8x3x16x16")]
    result = build_engine(models["dynamic"], profiles, rtx, BuildOptions(target_cc=("8.9",)))
    assert len(result.profiles) == 2 and len(result.plan) > 1000


def test_static_model_needs_no_profile(models, rtx):
    result = build_engine(models["static"], [], rtx, BuildOptions(target_cc=("8.9",)))
    assert result.io[0]["shape"] == [2, 3, 16, 16]


def test_options_reach_the_builder(models, rtx):
    options = BuildOptions(workspace_bytes=1 << 30, optimization_level=1, target_cc=["12.0", "8.6"])
    result = build_engine(models["dynamic"], [parse_profile(DYNAMIC)], rtx, options)
    assert result.targets == ("8.6", "12.0")
    assert result.to_json()["options"] == {
        "workspace_bytes": 1 << 30,
        "optimization_level": 1,
        "target_cc": ["8.6", "12.0"],
    }


@pytest.mark.parametrize(
    "profile, fragment",
    [
        ("1x3x16:2x3x16:4x3x16", "rank 3"),  # wrong rank
        ("1x4x16x16:2x4x16x16:4x4x16x16", "fixes it at 3"),  # wrong fixed channel
        ("images=1x3x16x16", "inputs are x"),  # unknown input name
        ("1x3x16x16:8x3x16x16:4x3x16x16", "min <= opt <= max"),
    ],
)
def test_profile_not_matching_onnx(models, rtx, profile, fragment):
    with pytest.raises(UsageError, match=fragment):
        build_engine(models["dynamic"], [parse_profile(profile)], rtx)


def test_dynamic_input_without_profile(models, rtx):
    with pytest.raises(UsageError, match=r"dynamic input\(s\) x \(\?x3x16x16\)"):
        build_engine(models["dynamic"], [], rtx)


def test_corrupt_onnx_is_one_line_usage_error(models, rtx, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(models["dynamic"].read_bytes()[:200])
    with pytest.raises(UsageError) as info:
        build_engine(bad, [parse_profile(DYNAMIC)], rtx)
    message = str(info.value)
    assert "\n" not in message and "bad.onnx" in message and "Failed to parse the ONNX model" in message
    assert info.value.exit_code == 2


def test_missing_onnx(rtx, tmp_path):
    with pytest.raises(UsageError, match="not found"):
        build_engine(tmp_path / "nope.onnx", [], rtx)


def test_fp8_needs_89(models, rtx):
    with pytest.raises(UsageError, match=r"FP8 .* target\(s\) 8\.6 lack it"):
        build_engine(models["fp8"], [parse_profile(DYNAMIC)], rtx, BuildOptions(target_cc=("8.6", "8.9")))
    options = BuildOptions(target_cc=("8.9", "12.0"))
    result = build_engine(models["fp8"], [parse_profile(DYNAMIC)], rtx, options)
    assert len(result.plan) > 1000


def test_build_failure_is_one_line(models, rtx):
    # 1 KiB of workspace is too little for any convolution kernel.
    with pytest.raises(UsageError) as info:
        options = BuildOptions(workspace_bytes=1024, target_cc=("8.6",))
        build_engine(models["dynamic"], [parse_profile(DYNAMIC)], rtx, options)
    message = str(info.value)
    assert message.startswith("TensorRT-RTX") and "could not build" in message and "\n" not in message
    assert "/_src/" not in message and ".cpp:" not in message


def test_timing_cache_is_skipped_by_rtx(models, rtx, tmp_path):
    cache = tmp_path / "timing.cache"
    messages: list[str] = []
    result = build_engine(
        models["dynamic"], [parse_profile(DYNAMIC)], rtx, timing_cache=cache, progress=messages.append
    )
    assert not result.timing_cache_used and not cache.exists()
    assert any("keeps none" in m for m in messages)


def _bare_rtx_build(path: Path, profiles: list[tuple], targets: tuple[str, ...], workspace: int | None = None,
                    level: int | None = None) -> bytes:
    """The plan TensorRT-RTX builds from its own API with these settings and its defaults otherwise
    (what enginekit's builder did by hand before it used Polygraphy's loaders)."""
    logger = trt_logger(trt_rtx)
    trt_builder = trt_rtx.Builder(logger)
    network = trt_builder.create_network(0)
    parser = trt_rtx.OnnxParser(network, logger)
    assert parser.parse_from_file(str(path))
    config = trt_builder.create_builder_config()
    for shapes in profiles:
        profile = trt_builder.create_optimization_profile()
        profile.set_shape("x", *shapes)
        assert config.add_optimization_profile(profile) >= 0
    if workspace is not None:
        config.set_memory_pool_limit(trt_rtx.MemoryPoolType.WORKSPACE, workspace)
    if level is not None:
        config.builder_optimization_level = level
    config.num_compute_capabilities = len(targets)
    for index, cc in enumerate(targets):
        assert config.set_compute_capability(getattr(trt_rtx.ComputeCapability, "SM" + cc.replace(".", "")), index)
    return bytes(memoryview(trt_builder.build_serialized_network(network, config)))


@pytest.mark.parametrize("graph, profiles, options", [
    ("dynamic", ["1x3x16x16", "2x3x16x16:4x3x16x16:8x3x16x16"],
     BuildOptions(workspace_bytes=1 << 30, optimization_level=1, target_cc=("8.6", "12.0"))),
    ("static", [], BuildOptions(target_cc=("8.9",))),
    ("fp16", [DYNAMIC], BuildOptions()),  # the portable default targets
    ("fp8", [DYNAMIC], BuildOptions(target_cc=("8.9", "12.0"))),
])
def test_plans_are_those_tensorrt_rtx_builds_itself(models, rtx, no_gpu, graph, profiles, options):
    """Through Polygraphy's loaders, the plan is byte for byte the one TensorRT-RTX's own API gives with the
    same settings: Polygraphy's defaults (timing cache, profiling verbosity) change nothing in it."""
    parsed = [parse_profile(p) for p in profiles]
    result = build_engine(models[graph], parsed, rtx, options)
    shapes = [(r.min, r.opt, r.max) for p in parsed for r in p.inputs.values()]
    bare = _bare_rtx_build(models[graph], shapes, result.targets, options.workspace_bytes, options.optimization_level)
    assert len(result.plan) > 1000 and result.plan == bare


def test_unsupported_node_is_named_in_one_line(rtx, tmp_path):
    graph = helper.make_graph([helper.make_node("FooBar", ["x"], ["y"], name="my_node")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "custom.onnx")
    with pytest.raises(UsageError) as info:
        build_engine(tmp_path / "custom.onnx", [], rtx)
    assert str(info.value).startswith("cannot build from custom.onnx: ") and "\n" not in str(info.value)
    assert str(info.value).endswith("(node my_node, FooBar)") and "Plugin not found" in str(info.value)


def test_tensorrt_log_reaches_the_reporter_not_logging(rtx, caplog):
    """TensorRT's warnings are the reporter's warnings (once each); its errors explain a failure; nothing
    goes through Python logging, so API users see no raw log line."""
    from enginekit import reporting
    from enginekit.trt.binding import capturing

    logger = trt_logger(trt_rtx)
    with caplog.at_level("DEBUG"), reporting.collecting(quiet=True) as events, capturing(logger):
        config = trt_rtx.Builder(logger).create_builder_config()
        for _ in range(2):  # TensorRT-RTX logs a warning and ignores the setting
            config.hardware_compatibility_level = trt_rtx.HardwareCompatibilityLevel.AMPERE_PLUS
        logger.log(trt_rtx.ILogger.Severity.ERROR, "an error")
        logger.log(trt_rtx.ILogger.Severity.INFO, "chatter")
    assert events.warnings == ["TensorRT-RTX: setHardwareCompatibilityLevel() is unsupported in TensorRT-RTX."]
    assert logger.errors == ["an error"] and not caplog.records


def test_polygraphy_is_bound_to_the_backend_in_use(rtx, fake_tensorrt, monkeypatch):
    """One process may build with TensorRT-RTX and then use TensorRT (or the reverse): Polygraphy's
    TensorRT modules follow, whatever POLYGRAPHY_USE_TENSORRT_RTX said when polygraphy was imported."""
    from polygraphy import config
    from polygraphy.backend.tensorrt_rtx import config as rtx_config
    from polygraphy.backend.trt import loader, util

    bind(rtx)
    assert config.USE_TENSORRT_RTX and loader.trt.__version__ == rtx_config.trt.__version__ == rtx.version
    assert util.get_trt_logger() is trt_logger(trt_rtx)
    fake_tensorrt("10.13.3.9")
    stand_in = sys.modules["tensorrt"]
    stand_in.ILogger = trt_rtx.ILogger  # enough for enginekit's logger class
    trt10 = resolve_flavour("tensorrt")
    try:
        bind(trt10)
        assert not config.USE_TENSORRT_RTX and loader.trt.__version__ == "10.13.3.9"
        assert util.get_trt_logger() is trt_logger(stand_in)
    finally:
        bind(rtx)
    assert loader.trt.__version__ == rtx.version


def test_build_options_validation():
    with pytest.raises(UsageError, match="0..5"):
        BuildOptions(optimization_level=6)
    with pytest.raises(UsageError, match="positive"):
        BuildOptions(workspace_bytes=0)
    with pytest.raises(UsageError, match="malformed compute capability"):
        BuildOptions(target_cc=("ampere",))
    assert BuildOptions(target_cc=("sm89", "8.6")).to_json()["target_cc"] == ["8.6", "8.9"]


# --- backend selection ---------------------------------------------------------------


def test_unknown_backend():
    with pytest.raises(UsageError, match="auto, tensorrt, tensorrt-rtx") as info:
        resolve_flavour("onnxruntime")
    assert info.value.exit_code == 2


def test_tensorrt_not_installed(fake_tensorrt):
    fake_tensorrt(None)
    with pytest.raises(CapabilityError) as info:
        resolve_flavour("tensorrt")
    assert "pip install tensorrt-cu13" in str(info.value) and info.value.exit_code == 3
    assert "\n" not in str(info.value)


def test_rtx_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)
    pip = "pip install tensorrt-rtx tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings"
    with pytest.raises(CapabilityError, match=pip):
        resolve_flavour("tensorrt-rtx")


def test_auto_with_nothing_installed(monkeypatch, fake_tensorrt):
    fake_tensorrt(None)
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)
    with pytest.raises(CapabilityError, match="no TensorRT backend is installed"):
        resolve_flavour("auto")


def test_auto_prefers_tensorrt_with_a_gpu(monkeypatch, fake_tensorrt):
    fake_tensorrt("10.13.3.9")
    monkeypatch.setattr(flavours, "gpu_info", lambda: RTX_GPU)
    assert resolve_flavour("auto").name == "tensorrt-10"
    monkeypatch.setattr(flavours, "gpu_info", lambda: None)
    assert resolve_flavour("auto").name == "tensorrt-rtx"  # TensorRT cannot build without a GPU


@pytest.mark.parametrize(
    "version, row",
    [("10.13.3.9", "tensorrt-10"), ("11.4.0.1", "tensorrt-11"), ("12.0.0", "tensorrt-11")],
)
def test_row_by_major_version(fake_tensorrt, version, row):
    fake_tensorrt(version)
    backend = resolve_flavour("tensorrt")
    assert (backend.name, backend.version) == (row, version)


def test_old_tensorrt_refused(fake_tensorrt):
    fake_tensorrt("8.6.1")
    with pytest.raises(CapabilityError, match="needs TensorRT 10 or newer"):
        resolve_flavour("tensorrt")


def test_tensorrt_build_needs_gpu(models, fake_tensorrt, no_gpu):
    fake_tensorrt("11.4.0.1")
    with pytest.raises(CapabilityError, match="needs an NVIDIA GPU"):
        build_engine(models["dynamic"], [parse_profile(DYNAMIC)], resolve_flavour("tensorrt"))


def test_import_enginekit_trt_imports_no_tensorrt():
    code = "import sys, enginekit.trt; assert not {'tensorrt', 'tensorrt_rtx', 'torch'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- targets, GPUs, fp8 --------------------------------------------------------------


def test_target_90_refused_by_rtx(rtx):
    with pytest.raises(UsageError, match=r"9\.0; supported: 7\.5, 8\.0, 8\.6, 8\.9, 12\.0"):
        validate_targets(rtx, "8.6,9.0")


def test_target_90_refused_at_build(models, rtx):
    with pytest.raises(UsageError, match=r"cannot target compute capability 9\.0"):
        build_engine(models["static"], [], rtx, BuildOptions(target_cc=("9.0",)))


def test_targets_normalized(rtx):
    assert validate_targets(rtx, "12.0, sm_86,8.9,8.6") == ("8.6", "8.9", "12.0")
    with pytest.raises(UsageError):
        validate_targets(rtx, ",")


def test_default_targets(rtx, fake_tensorrt):
    assert default_targets(rtx, None) == PORTABLE_RTX_TARGETS
    assert default_targets(rtx, RTX_GPU) == ("8.9",)
    assert default_targets(rtx, GpuInfo("NVIDIA H100", "9.0")) == PORTABLE_RTX_TARGETS
    fake_tensorrt("11.4.0.1")
    trt11 = resolve_flavour("tensorrt")
    assert default_targets(trt11, RTX_GPU) == ("8.9",)
    with pytest.raises(UsageError, match="needs --trt tensorrt-rtx"):
        validate_targets(trt11, "8.6", RTX_GPU)


def test_fp8_helper():
    assert fp8_supported(["8.9", "12.0"])
    assert not fp8_supported(["8.6", "8.9"]) and not fp8_supported([])
    with pytest.raises(UsageError, match=r"7\.5, 8\.6 lack it"):
        require_fp8(["7.5", "8.6", "8.9"])


def test_gpu_info_respects_hidden_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    flavours.gpu_info.cache_clear()
    try:
        assert flavours.gpu_info() is None
    finally:
        flavours.gpu_info.cache_clear()


def _fake_nvml(devices):
    """A stand-in ``pynvml`` holding ``devices``: (name, (major, minor), uuid); None: no driver."""
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    module.NVMLError = NVMLError

    def init():
        if devices is None:
            raise NVMLError("NVML Shared Library Not Found")

    module.nvmlInit, module.nvmlShutdown = init, lambda: None
    module.nvmlDeviceGetCount = lambda: len(devices)
    module.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    module.nvmlDeviceGetName = lambda d: d[0]
    module.nvmlDeviceGetCudaComputeCapability = lambda d: d[1]
    module.nvmlDeviceGetUUID = lambda d: d[2]
    module.nvmlDeviceGetMemoryInfo = lambda d: types.SimpleNamespace(total=24 << 30)
    return module


FAKE_GPUS = [("NVIDIA GeForce RTX 4090", (8, 9), "GPU-aaaa1111"), ("NVIDIA RTX A4000", (8, 6), "GPU-bbbb2222")]


@pytest.mark.parametrize("visible, expected", [
    (None, ["NVIDIA GeForce RTX 4090 (8.9)", "NVIDIA RTX A4000 (8.6)"]),
    ("1", ["NVIDIA RTX A4000 (8.6)"]),
    ("1,0", ["NVIDIA RTX A4000 (8.6)", "NVIDIA GeForce RTX 4090 (8.9)"]),
    ("GPU-bbbb", ["NVIDIA RTX A4000 (8.6)"]),
    ("0,7,1", ["NVIDIA GeForce RTX 4090 (8.9)"]),  # CUDA stops at the first entry naming no GPU
    ("", []),
    ("-1", []),
])
def test_gpus_through_nvml(monkeypatch, visible, expected):
    from enginekit import gpu

    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(FAKE_GPUS))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpu.gpus.cache_clear()
    try:
        assert [str(g) for g in gpu.gpus()] == expected
        first = gpu.gpu_info()
        assert (str(first) if first else None) == (expected[0] if expected else None)
        if first is not None:  # what manifests and cache keys record stays name + capability
            assert first.to_json() == {"name": first.name, "compute_capability": first.compute_capability}
    finally:
        gpu.gpus.cache_clear()


@pytest.mark.parametrize("nvml", [None, "missing"])
def test_no_driver_means_no_gpu(monkeypatch, nvml):
    from enginekit import gpu

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(None) if nvml is None else None)
    gpu.gpus.cache_clear()
    try:
        assert gpu.gpus() == () and gpu.gpu_info() is None
    finally:
        gpu.gpus.cache_clear()


@pytest.mark.gpu
def test_gpu_info_shape():
    """On a GPU machine NVML finds it (elsewhere test_gpus_through_nvml runs the same code on a stand-in)."""
    gpu = flavours.gpu_info()
    assert gpu is not None and gpu.name and flavours.cc_tuple(gpu.compute_capability) >= (3, 0)


# --- can an engine run here? ---------------------------------------------------------

RTX_BUILT = BuiltFor("tensorrt-rtx", "1.7.1.116", ("8.6", "8.9"))


def _backend(row: str, version: str) -> Flavour:
    return Flavour(name=row, version=version, traits=TRAITS[row], module=types.ModuleType("stand_in"))


def test_can_run_here_without_gpu():
    ok, reason = can_run_here(_backend("tensorrt-rtx", "1.7.1.116"), RTX_BUILT, gpu=None)
    assert not ok
    assert reason == (
        "engine built with TensorRT-RTX 1.7.1.116 for compute capability 8.6, 8.9; "
        "this machine has no GPU"
    )


def test_can_run_here_other_version():
    built = {
        "backend": "tensorrt-10",
        "backend_version": "10.13.3.9",
        "targets": ["8.9"],
        "gpu": RTX_GPU.to_json(),
    }
    ok, reason = can_run_here(_backend("tensorrt-11", "11.4.0.1"), built, gpu=RTX_GPU)
    assert not ok and "TensorRT 10.13.3.9" in reason and "TensorRT 11.4.0.1 is installed" in reason


def test_can_run_here_gpu_not_targeted():
    hopper = GpuInfo("NVIDIA H100", "9.0")
    ok, reason = can_run_here(_backend("tensorrt-rtx", "1.7.1.116"), RTX_BUILT, gpu=hopper)
    assert not ok and "NVIDIA H100 (9.0), is not among them" in reason


def test_can_run_here_other_gpu_for_tensorrt():
    built = BuiltFor("tensorrt-11", "11.4.0.1", ("8.9",), RTX_GPU)
    ampere = GpuInfo("NVIDIA RTX A4000", "8.6")
    ok, reason = can_run_here(_backend("tensorrt-11", "11.4.0.1"), built, gpu=ampere)
    assert not ok and "rebuild it here" in reason


def test_can_run_here_missing_backend_and_ok():
    ok, reason = can_run_here(None, RTX_BUILT, gpu=RTX_GPU)
    assert not ok and "pip install tensorrt-rtx" in reason
    ok, reason = can_run_here(_backend("tensorrt-rtx", "1.7.1.116"), RTX_BUILT, gpu=RTX_GPU)
    assert ok and reason.endswith("runs on NVIDIA GeForce RTX 4090 (8.9)")


def test_built_for_round_trip(models, rtx):
    result = build_engine(models["static"], [], rtx, BuildOptions(target_cc=("8.9",)))
    assert BuiltFor.from_json(result.to_json()) == result.built_for()


# --- the traits table: the TensorRT-RTX row checked against the installed module ----
RTX = TRAITS["tensorrt-rtx"]


def _rtx_network():
    return trt_rtx.Builder(trt_logger(trt_rtx)).create_network(0)


def test_installed_rtx_resolves_to_its_row(rtx):
    assert rtx.traits is RTX and int(trt_rtx.__version__.split(".")[0]) in RTX.majors


@pytest.mark.parametrize("row, flagged", [("tensorrt-10", True), ("tensorrt-11", False), ("tensorrt-rtx", False)])
def test_network_gets_the_strongly_typed_flag_only_where_needed(row, flagged, tmp_path):
    """Polygraphy's NetworkFromOnnxPath is asked for the STRONGLY_TYPED flag where the row says so."""
    poly = types.SimpleNamespace(NetworkFromOnnxPath=lambda path, strongly_typed: (path, strongly_typed))
    backend = Flavour(name=row, version="0", traits=TRAITS[row], module=types.ModuleType("stand_in"))
    assert builder.network_loader(poly, backend, tmp_path / "m.onnx") == (str(tmp_path / "m.onnx"), flagged)


def test_fact_strongly_typed_default():
    flag = trt_rtx.NetworkDefinitionCreationFlag.STRONGLY_TYPED
    assert _rtx_network().get_flag(flag) is RTX.strongly_typed_is_default


def test_fact_strongly_typed_flag_needed():
    assert hasattr(trt_rtx.NetworkDefinitionCreationFlag, "STRONGLY_TYPED")  # exists, yet not needed
    assert RTX.strongly_typed_flag_needed is not RTX.strongly_typed_is_default


def test_fact_weak_typing_flags():
    present = [f for f in ("FP16", "INT8", "BF16", "FP8") if hasattr(trt_rtx.BuilderFlag, f)]
    assert bool(present) is RTX.has_weak_typing_flags


def test_fact_timing_cache():
    config = trt_rtx.Builder(trt_logger(trt_rtx)).create_builder_config()
    cache = config.create_timing_cache(b"")
    with pytest.warns(DeprecationWarning, match="no-ops"):
        config.set_timing_cache(cache, False)
    assert not RTX.has_timing_cache


def test_fact_compute_capability_targets():
    config = trt_rtx.Builder(trt_logger(trt_rtx)).create_builder_config()
    assert hasattr(config, "set_compute_capability") and hasattr(config, "num_compute_capabilities")
    assert RTX.supports_compute_capability_targets
    in_enum = [n[2:] for n in trt_rtx.ComputeCapability.__members__ if n.startswith("SM")]
    assert RTX.compute_capabilities == tuple(f"{n[:-1]}.{n[-1]}" for n in in_enum)
    assert "9.0" not in RTX.compute_capabilities
    assert set(PORTABLE_RTX_TARGETS) <= set(RTX.compute_capabilities)


def test_fact_needs_gpu_to_build(models, rtx, no_gpu):
    # An ahead-of-time build with the GPU check off; on a GPU-less machine it is the real thing.
    assert build_engine(models["static"], [], rtx, BuildOptions(target_cc=("7.5",))).plan
    assert not RTX.needs_gpu_to_build


def test_fact_hardware_compatibility():
    config = trt_rtx.Builder(trt_logger(trt_rtx)).create_builder_config()
    config.hardware_compatibility_level = trt_rtx.HardwareCompatibilityLevel.AMPERE_PLUS
    honoured = config.hardware_compatibility_level == trt_rtx.HardwareCompatibilityLevel.AMPERE_PLUS
    assert honoured is RTX.supports_hardware_compatibility


def test_fact_version_compatibility(models):
    logger = trt_logger(trt_rtx)
    trt_builder = trt_rtx.Builder(logger)
    network = trt_builder.create_network(0)
    parser = trt_rtx.OnnxParser(network, logger)
    assert parser.parse_from_file(str(models["static"]))
    config = trt_builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt_rtx.ComputeCapability.SM86, 0)
    config.set_flag(trt_rtx.BuilderFlag.VERSION_COMPATIBLE)
    built = trt_builder.build_serialized_network(network, config) is not None
    assert built is RTX.supports_version_compatibility


def test_fact_workspace_via_memory_pool_limit():
    config = trt_rtx.Builder(trt_logger(trt_rtx)).create_builder_config()
    config.set_memory_pool_limit(trt_rtx.MemoryPoolType.WORKSPACE, 1 << 28)
    assert config.get_memory_pool_limit(trt_rtx.MemoryPoolType.WORKSPACE) == 1 << 28
    assert not hasattr(config, "max_workspace_size") and RTX.workspace_via_memory_pool_limit


def test_fact_deserialize_without_gpu(models, rtx):
    if flavours.gpu_info() is not None:
        pytest.skip("this machine has a GPU: deserializing is expected to work")
    plan = build_engine(models["static"], [], rtx, BuildOptions(target_cc=("8.6",))).plan
    engine = trt_rtx.Runtime(trt_logger(trt_rtx)).deserialize_cuda_engine(plan)
    assert (engine is not None) is RTX.can_deserialize_without_gpu


# --- TensorRT proper -----------------------------------------------------------------


@pytest.mark.tensorrt
def test_tensorrt_row_matches_installed_module():
    trt = pytest.importorskip("tensorrt", reason=NEEDS_TENSORRT)
    backend = resolve_flavour("tensorrt")
    traits = backend.traits
    assert hasattr(trt.BuilderFlag, "FP16") is traits.has_weak_typing_flags
    assert hasattr(trt.IBuilderConfig, "create_timing_cache") is traits.has_timing_cache
    assert hasattr(trt.IBuilderConfig, "set_compute_capability") is traits.supports_compute_capability_targets
    assert hasattr(trt.IBuilderConfig, "set_memory_pool_limit") is traits.workspace_via_memory_pool_limit
    assert hasattr(trt.BuilderFlag, "VERSION_COMPATIBLE") is traits.supports_version_compatibility


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_tensorrt_build_with_timing_cache(models, tmp_path):
    pytest.importorskip("tensorrt", reason=NEEDS_TENSORRT)
    if flavours.gpu_info() is None:
        pytest.skip("TensorRT proper needs a GPU to build")
    backend = resolve_flavour("tensorrt")
    cache = tmp_path / "timing.cache"
    result = build_engine(models["fp16"], [parse_profile(DYNAMIC)], backend, timing_cache=cache)
    assert result.timing_cache_used and cache.stat().st_size > 0
    assert {t["name"]: t["dtype"] for t in result.io} == {"x": "float32", "y": "float16"}
    ok, reason = can_run_here(backend, result.built_for())
    assert ok, reason


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_timing_cache_kept_and_reused_on_a_gpu(models, tmp_path):
    """Two builds on one GPU: the second starts from the timing cache the first kept in the cache."""
    pytest.importorskip("tensorrt", reason=NEEDS_TENSORRT)
    gpu = flavours.gpu_info()
    if gpu is None:
        pytest.skip("TensorRT proper needs a GPU to build")
    from enginekit.cache import Cache
    from enginekit.hashing import key_for
    from enginekit.trt.timing import FILE, KIND, kept_timing_cache, timing_cache_parts

    backend, cache = resolve_flavour("tensorrt"), Cache(tmp_path / "cache")
    for graph in ("dynamic", "fp16"):
        messages: list[str] = []
        with kept_timing_cache(cache, backend, gpu) as path:
            result = build_engine(models[graph], [parse_profile(DYNAMIC)], backend, timing_cache=path,
                                  progress=messages.append)
        assert result.timing_cache_used
        kept = cache.lookup(KIND, key_for(timing_cache_parts(backend, gpu))).entry
        assert kept is not None and kept.file(FILE).stat().st_size > 0
    assert "timing cache: loaded timing.cache" in messages  # the second build read the first one's


# --- the runner: polygraphy's TrtRunner over a plan ------------------------------------------


def test_repeat_runner_feeds_the_same_inputs_and_releases_the_engine(monkeypatch, tmp_path, rtx):
    """The benchmark's engine rows go through polygraphy's TrtRunner (checked here with a stand-in)."""
    from polygraphy.backend import trt as poly_trt

    from enginekit.trt.runner import repeat_runner

    calls: list = []

    class FakeRunner:
        def __init__(self, engine) -> None:
            calls.append(("engine", engine))

        def activate(self) -> None:
            calls.append("activate")

        def deactivate(self) -> None:
            calls.append("deactivate")

        def infer(self, feed, check_inputs=True, copy_outputs_to_host=True):
            calls.append(("infer", {k: v.shape for k, v in feed.items()}, copy_outputs_to_host))
            return {}

    monkeypatch.setattr(poly_trt, "TrtRunner", FakeRunner)
    monkeypatch.setattr(poly_trt, "EngineFromBytes", lambda loader: "engine")
    plan = tmp_path / "engine.plan"
    plan.write_bytes(b"plan")
    feed = {"x": np.zeros((2, 3, 16, 16), np.float32)}
    with repeat_runner(plan, rtx, feed, include_copies=True) as run:
        run()
        run()
    assert calls == [("engine", "engine"), "activate", ("infer", {"x": (2, 3, 16, 16)}, True),
                     ("infer", {"x": (2, 3, 16, 16)}, True), "deactivate"]
