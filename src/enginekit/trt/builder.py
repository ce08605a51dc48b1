"""ONNX -> TensorRT engine plan: one strongly typed build path for every backend.

Precision lives in the ONNX graph (fp16 casts, int8/fp8 Q/DQ nodes); the builder only
follows it. What differs between TensorRT 10, 11 and TensorRT-RTX is read from the traits
table in ``backends``.

There is deliberately no ``engine_io(plan)``: every backend, TensorRT-RTX included, needs a
GPU to deserialize a plan (TensorRT-RTX 1.7 fails creating a CUDA stream without one), so the
I/O of an engine is read from the network at build time and kept in ``BuildResult.io``.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from enginekit.errors import CapabilityError, UsageError
from enginekit.fsutil import atomic_write_bytes
from enginekit.shapes import Profile, check_against_onnx_input
from enginekit.trt.backends import (
    TRAITS,
    Backend,
    GpuInfo,
    cc_tuple,
    fp8_unsupported,
    gpu_info,
    normalize_cc,
    require_fp8,
    resolve_targets,
)

Progress = Callable[[str], None]

_log = logging.getLogger("enginekit.trt")

# TensorRT DataType names -> the names enginekit writes in manifests (numpy's where it has one).
_DTYPE_NAMES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
    "FP8": "float8_e4m3",
    "INT4": "int4",
    "FP4": "float4_e2m1",
    "E8M0": "float8_e8m0",
}

MAX_OPTIMIZATION_LEVEL = 5
_MAX_MESSAGE = 400


@dataclass(frozen=True)
class BuildOptions:
    """Builder settings that change the engine (and therefore its cache key)."""

    workspace_bytes: int | None = None  # None: the backend's default (all device memory)
    optimization_level: int | None = None  # None: the backend's default (3)
    target_cc: tuple[str, ...] | None = None  # None: backends.default_targets

    def __post_init__(self) -> None:
        if self.workspace_bytes is not None and self.workspace_bytes <= 0:
            raise UsageError(f"workspace must be a positive number of bytes, not {self.workspace_bytes}")
        level = self.optimization_level
        if level is not None and not 0 <= level <= MAX_OPTIMIZATION_LEVEL:
            raise UsageError(f"optimization level must be 0..{MAX_OPTIMIZATION_LEVEL}, not {level}")
        if self.target_cc is not None:
            # Normalized and sorted so "8.9,8.6" and "8.6,8.9" share a cache key.
            targets = sorted({normalize_cc(t) for t in self.target_cc}, key=cc_tuple)
            object.__setattr__(self, "target_cc", tuple(targets))

    def to_json(self) -> dict[str, Any]:
        return {
            "workspace_bytes": self.workspace_bytes,
            "optimization_level": self.optimization_level,
            "target_cc": list(self.target_cc) if self.target_cc is not None else None,
        }


@dataclass(frozen=True)
class BuiltFor:
    """What an engine was built with and for: enough to tell whether it runs here."""

    backend: str  # a TRAITS row name: "tensorrt-10", "tensorrt-11", "tensorrt-rtx"
    version: str
    targets: tuple[str, ...] = ()  # compute capabilities (TensorRT-RTX)
    gpu: GpuInfo | None = None  # the GPU TensorRT proper built on

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "BuiltFor":
        """Read the keys ``BuildResult.to_json`` writes (as a manifest stores them)."""
        gpu = data.get("gpu")
        return cls(
            backend=str(data["backend"]),
            version=str(data["backend_version"]),
            targets=tuple(data.get("targets") or ()),
            gpu=GpuInfo(gpu["name"], gpu["compute_capability"]) if gpu else None,
        )


@dataclass(frozen=True)
class BuildResult:
    """A built engine: the raw plan (no header) and what a manifest records about it."""

    plan: bytes = field(repr=False)
    build_seconds: float
    io: list[dict[str, Any]]
    backend: str
    backend_version: str
    targets: tuple[str, ...]
    gpu: GpuInfo | None
    options: BuildOptions
    profiles: list[Profile]
    timing_cache_used: bool
    dropped_targets: tuple[str, ...] = ()  # default targets the backend could not compile for

    def built_for(self) -> BuiltFor:
        return BuiltFor(self.backend, self.backend_version, self.targets, self.gpu)

    def to_json(self) -> dict[str, Any]:
        """Everything but the plan, JSON-ready."""
        return {
            "backend": self.backend,
            "backend_version": self.backend_version,
            "targets": list(self.targets),
            "gpu": self.gpu.to_json() if self.gpu else None,
            "options": self.options.to_json(),
            "profiles": [p.to_json() for p in self.profiles],
            "io": self.io,
            "build_seconds": round(self.build_seconds, 3),
            "plan_bytes": len(self.plan),
            "timing_cache_used": self.timing_cache_used,
            "dropped_targets": list(self.dropped_targets),
        }


# --- TensorRT callbacks --------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _logger_for(trt: ModuleType) -> Any:
    """One logger per backend module: TensorRT complains when builders get different ones."""

    class QuietLogger(trt.ILogger):
        """Warnings go to Python logging; errors are also kept to explain a failure."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(msg)
                _log.debug("%s", msg)  # reported once, as the UsageError of the failed step
            elif int(severity) == int(trt.ILogger.Severity.WARNING):
                _log.warning("%s", msg)

    return QuietLogger()


def _progress_monitor(trt: ModuleType, say: Progress) -> Any | None:
    """Forward the builder's top two levels of phases to ``say``; None if unsupported."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Monitor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self.depth: dict[str, int] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            depth = 0 if parent_phase is None else self.depth.get(parent_phase, 0) + 1
            self.depth[phase_name] = depth
            if depth <= 1:
                _safe_say(say, "  " * depth + phase_name)

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True  # never cancel

        def phase_finish(self, phase_name: str) -> None:
            pass

    return Monitor()


def _safe_say(say: Progress, message: str) -> None:
    """A failing progress callback must not abort a build."""
    try:
        say(message)
    except Exception:  # noqa: BLE001
        _log.debug("progress callback failed", exc_info=True)


def _tidy_trt_message(message: str) -> str:
    """A TensorRT log message without source locations, on one line, not too long."""
    text = " ".join(message.split())
    text = re.sub(r"^[\w:]+: Error Code \d+: [\w ]+? \((.*)\)$", r"\1", text)
    text = re.sub(r"\[[\w.]+:\d+: \w+\] ", "", text)
    text = re.sub(r" In \w+ at /\S+", "", text)
    text = re.sub(r"^Assertion failed: [^:]*: ", "", text)
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


# --- build steps ---------------------------------------------------------------------


def _create_network(builder: Any, backend: Backend) -> Any:
    """An empty strongly typed network (the flag only where the backend needs it)."""
    flags = 0
    if backend.traits.strongly_typed_flag_needed:
        flags |= 1 << int(backend.module.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return builder.create_network(flags)


def _parse_onnx(trt: ModuleType, network: Any, logger: Any, onnx_path: Path) -> Any:
    """Fill ``network`` from the ONNX file; keep the returned parser alive (it owns weights)."""
    if not onnx_path.is_file():
        raise UsageError(f"ONNX file not found: {onnx_path}")
    parser = trt.OnnxParser(network, logger)
    # parse_from_file, not parse(bytes): it finds external weight files next to the model.
    if not parser.parse_from_file(str(onnx_path)):
        raise UsageError(f"cannot build from {onnx_path.name}: {_parser_error(parser)}")
    return parser


def _parser_error(parser: Any) -> str:
    if parser.num_errors == 0:
        return "the ONNX parser failed without a message"
    error = parser.get_error(0)
    text = _tidy_trt_message(error.desc())
    if error.node() >= 0:
        text += f" (node {error.node_name() or error.node()}, {error.node_operator()})"
    if parser.num_errors > 1:
        text += f" (+{parser.num_errors - 1} more errors)"
    return text


def dtype_name(dtype: Any) -> str:
    """TensorRT DataType -> ``"float16"`` and the like."""
    name = getattr(dtype, "name", str(dtype).split(".")[-1])
    return _DTYPE_NAMES.get(name, name.lower())


def network_io(network: Any) -> list[dict[str, Any]]:
    """Inputs then outputs: name, mode, dtype and shape (-1 where dynamic)."""
    tensors = [(network.get_input(i), "input") for i in range(network.num_inputs)]
    tensors += [(network.get_output(i), "output") for i in range(network.num_outputs)]
    return [
        {"name": t.name, "mode": mode, "dtype": dtype_name(t.dtype), "shape": [int(d) for d in t.shape]}
        for t, mode in tensors
    ]


def _format_dims(dims: Sequence[int]) -> str:
    return "x".join(str(d) if d >= 0 else "?" for d in dims)


def _add_profiles(
    builder: Any, config: Any, network: Any, profiles: Sequence[Profile], logger: Any
) -> list[Profile]:
    """Check each profile against the network inputs and add it; returns them bound."""
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    names = [t.name for t in inputs]
    dims = {t.name: [int(d) for d in t.shape] for t in inputs}
    for tensor in inputs:
        if tensor.is_shape_tensor:
            raise UsageError(f"input {tensor.name!r} is a shape tensor, which enginekit does not support")
    dynamic = [n for n in names if any(d < 0 for d in dims[n])]
    if dynamic and not profiles:
        shown = ", ".join(f"{n} ({_format_dims(dims[n])})" for n in dynamic)
        raise UsageError(
            f"the ONNX has dynamic input(s) {shown} and no profile gives their shapes: "
            "pass --profile min:opt:max"
        )
    bound = [profile.bind(names) for profile in profiles]
    for profile in bound:
        trt_profile = builder.create_optimization_profile()
        for name, rng in profile.inputs.items():
            assert name is not None  # bind() named every range
            check_against_onnx_input(name, rng, [d if d >= 0 else None for d in dims[name]])
            trt_profile.set_shape(name, rng.min, rng.opt, rng.max)
        logger.errors.clear()
        if config.add_optimization_profile(trt_profile) < 0:
            reason = _tidy_trt_message(logger.errors[0]) if logger.errors else "invalid shapes"
            raise UsageError(f"profile {profile} was refused: {reason}")
    return bound


def _uses_fp8(trt: ModuleType, network: Any) -> bool:
    """Whether any layer produces an FP8 tensor (explicit FP8 Q/DQ in the graph)."""
    fp8 = getattr(trt.DataType, "FP8", None)
    if fp8 is None:
        return False
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if any(layer.get_output(j).dtype == fp8 for j in range(layer.num_outputs)):
            return True
    return False


def _apply_options(config: Any, backend: Backend, options: BuildOptions, targets: Sequence[str]) -> None:
    trt = backend.module
    if options.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
    if backend.traits.supports_compute_capability_targets:
        _set_targets(config, backend, targets)


def _set_targets(config: Any, backend: Backend, targets: Sequence[str]) -> None:
    """Ask TensorRT-RTX to compile for each target compute capability."""
    trt = backend.module
    config.num_compute_capabilities = len(targets)
    for index, cc in enumerate(targets):
        member = getattr(trt.ComputeCapability, "SM" + cc.replace(".", ""), None)
        if member is None or not config.set_compute_capability(member, index):
            raise CapabilityError(f"{backend.label} refused target compute capability {cc}")


def _load_timing_cache(config: Any, backend: Backend, path: Path | None, say: Progress) -> bool:
    """Attach the timing cache at ``path`` (new if absent or unusable); False where none applies."""
    if path is None:
        return False
    if not backend.traits.has_timing_cache:
        _safe_say(say, f"timing cache: {backend.traits.label} keeps none, skipped")
        return False
    data = path.read_bytes() if path.is_file() else b""
    try:
        cache = config.create_timing_cache(data)
    except Exception:  # noqa: BLE001  a truncated or foreign file
        cache = None
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        # Corrupt, or written by another version or GPU: start afresh rather than fail the build.
        _safe_say(say, f"timing cache {path.name} is unusable here; starting a new one")
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
        data = b""
    _safe_say(say, f"timing cache: {'loaded ' + path.name if data else 'new'}")
    return True


def _save_timing_cache(config: Any, path: Path) -> None:
    """Write the timing cache atomically: concurrent builds see the old or the new file."""
    atomic_write_bytes(path, bytes(memoryview(config.get_timing_cache().serialize())))


def _refused_target(errors: Sequence[str]) -> str | None:
    """"Cannot compile ... for Turing (SM75)" -> "7.5"."""
    for message in errors:
        match = re.search(r"\(SM(\d+)(\d)\)", message)
        if match:
            return f"{int(match.group(1))}.{match.group(2)}"
    return None


def _build_failure(backend: Backend, logger: Any) -> UsageError:
    errors = [e for e in logger.errors if e.strip()]
    reason = _tidy_trt_message(errors[0]) if errors else "no message from the builder"
    return UsageError(f"{backend.label} could not build the engine: {reason}")


def build_engine(
    onnx_path: Path,
    profiles: list[Profile],
    backend: Backend,
    options: BuildOptions = BuildOptions(),
    timing_cache: Path | None = None,
    progress: Progress | None = None,
) -> BuildResult:
    """Build a raw engine plan from a (strongly typed) ONNX file.

    ``profiles``: one TensorRT optimization profile each; names may be unbound for a
    single-input model. ``timing_cache`` is read and rewritten where the backend keeps one.
    """
    say = progress or (lambda _message: None)
    trt = backend.module
    onnx_path = Path(onnx_path)
    gpu = gpu_info()
    if backend.traits.needs_gpu_to_build and gpu is None:
        raise CapabilityError(
            f"{backend.label} needs an NVIDIA GPU to build; TensorRT-RTX builds without one "
            "(--backend tensorrt-rtx)"
        )
    targets = resolve_targets(backend, options.target_cc, gpu)
    logger = _logger_for(trt)
    logger.errors.clear()
    builder = trt.Builder(logger)
    network = _create_network(builder, backend)
    _safe_say(say, f"parsing {onnx_path.name}")
    parser = _parse_onnx(trt, network, logger, onnx_path)  # noqa: F841  held: it owns weights
    io = network_io(network)
    if _uses_fp8(trt, network) and fp8_unsupported(targets):
        require_fp8(targets, subject=f"{onnx_path.name} has FP8 tensors, which", fix="choose --target-cc 8.9,12.0")
    dropped: list[str] = []
    while True:
        config = builder.create_builder_config()
        bound = _add_profiles(builder, config, network, profiles, logger)
        _apply_options(config, backend, options, targets)
        cache_used = _load_timing_cache(config, backend, timing_cache, say)
        monitor = _progress_monitor(trt, say)
        if monitor is not None:
            config.progress_monitor = monitor  # kept referenced by `monitor` until the build ends
        where = f"compute capability {', '.join(targets)}" if targets else "this GPU"
        _safe_say(say, f"building with {backend.label} for {where}")
        logger.errors.clear()
        started = time.perf_counter()
        plan = builder.build_serialized_network(network, config)
        seconds = time.perf_counter() - started
        if plan is not None:
            break
        # TensorRT-RTX cannot compile some layers for some architectures (FP32 GEMM on Turing).
        # Where the user named no targets, drop the one it names and build for the rest.
        refused = _refused_target(logger.errors)
        if options.target_cc is None and refused in targets and len(targets) > 1:
            _log.warning("dropping compute capability %s: %s", refused, _tidy_trt_message(logger.errors[0]))
            _safe_say(say, f"compute capability {refused} dropped: {_tidy_trt_message(logger.errors[0])}")
            dropped.append(refused)
            targets = tuple(t for t in targets if t != refused)
            continue
        raise _build_failure(backend, logger)
    if cache_used and timing_cache is not None:
        _save_timing_cache(config, timing_cache)
    plan_bytes = bytes(memoryview(plan))
    _safe_say(say, f"built in {seconds:.1f} s, plan {len(plan_bytes) / 2**20:.1f} MiB")
    return BuildResult(
        plan=plan_bytes,
        build_seconds=seconds,
        io=io,
        backend=backend.name,
        backend_version=backend.version,
        targets=targets,
        gpu=gpu if backend.traits.needs_gpu_to_build else None,
        options=options,
        profiles=bound,
        timing_cache_used=cache_used,
        dropped_targets=tuple(dropped),
    )


# --- will an engine run here? --------------------------------------------------------


def _built_label(built: BuiltFor) -> str:
    row = TRAITS.get(built.backend)
    what = f"engine built with {row.label if row else built.backend} {built.version}"
    if built.targets and (row is None or row.supports_compute_capability_targets):
        return f"{what} for compute capability {', '.join(built.targets)}"
    if built.gpu is not None:
        return f"{what} on {built.gpu}"
    return what


def can_run_here(
    backend: Backend | None,
    built: BuiltFor | Mapping[str, Any],
    gpu: GpuInfo | None | Literal["detect"] = "detect",
) -> tuple[bool, str]:
    """Whether an engine (described by its manifest) runs with ``backend`` on this GPU.

    ``backend`` is the installed one (None: none installed). The reason is one line, fit to
    show in place of TensorRT's own deserialization error.
    """
    built = built if isinstance(built, BuiltFor) else BuiltFor.from_json(built)
    what = _built_label(built)
    row = TRAITS.get(built.backend)
    if row is None:
        return False, f"{what}: a backend enginekit does not know"
    if gpu == "detect":
        gpu = gpu_info()
    if gpu is None:
        return False, f"{what}; this machine has no GPU"
    if backend is None:
        return False, f"{what}, but {row.label} is not installed: {row.pip_install}"
    if backend.traits.family != row.family or backend.version != built.version:
        # Plans carry a version tag: another TensorRT (or patch release) refuses them.
        return False, f"{what}, but {backend.label} is installed: rebuild it with this one"
    if row.supports_compute_capability_targets:
        if gpu.compute_capability not in built.targets:
            return False, f"{what}; this machine's GPU, {gpu}, is not among them"
    elif built.gpu is not None and built.gpu.compute_capability != gpu.compute_capability:
        return False, f"{what}; this machine's GPU is {gpu}: rebuild it here"
    return True, f"{what}; runs on {gpu}"
