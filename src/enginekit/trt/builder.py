"""ONNX -> TensorRT engine plan through Polygraphy's loaders: one strongly typed build path for every backend.

Polygraphy parses (``NetworkFromOnnxPath``), configures (``CreateConfig``; ``CreateConfigRTX`` where
the backend targets compute capabilities) and builds (``EngineBytesFromNetwork``, which also saves
the timing cache); NVIDIA tests those against TensorRT 10, 11 and TensorRT-RTX. What differs between
the backends is read from the traits table in ``backends``. enginekit adds what Polygraphy leaves
to its callers: profiles checked against the graph, FP8 only for targets that have it, a default
target the backend cannot compile for dropped, TensorRT's own defaults kept where ``CreateConfig``
would change them (TF32 on, layer names only in the plan: engines stay what they were), and every
failure as one line.

Precision lives in the ONNX graph (fp16 casts, int8/fp8 Q/DQ nodes); the builder only follows it.

There is deliberately no ``engine_io(plan)``: every backend, TensorRT-RTX included, needs a
GPU to deserialize a plan (TensorRT-RTX 1.7 fails creating a CUDA stream without one), so the
I/O of an engine is read from the network at build time and kept in ``BuildResult.io``.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from enginekit import reporting
from enginekit.errors import CapabilityError, UsageError, first_line
from enginekit.shapes import Profile, check_against_onnx_input
from enginekit.trt.flavours import (
    TRAITS,
    Flavour,
    GpuInfo,
    cc_tuple,
    fp8_unsupported,
    gpu_info,
    normalize_cc,
    require_fp8,
    resolve_targets,
)
from enginekit.trt.binding import bind, capturing, quiet_polygraphy, tidy_message, trt_logger

Progress = Callable[[str], None]

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
# TensorRT-RTX keeps no timing cache: its calls warn that they are no-ops (Polygraphy makes them).
_RTX_TIMING_CACHE_WARNING = ".*[Tt]iming cache operations are no-ops"


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


# --- progress -----------------------------------------------------------------------


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
        pass


# --- the network ----------------------------------------------------------------------


def network_loader(poly: ModuleType, flavour: Flavour, onnx_path: Path) -> Any:
    """Polygraphy's ``NetworkFromOnnxPath`` for ``backend``: strongly typed, by the flag only where
    the backend needs it (TensorRT 11 and TensorRT-RTX networks are strongly typed by default)."""
    # parse_from_file, not bytes: the parser finds external weight files next to the model.
    return poly.NetworkFromOnnxPath(str(onnx_path), strongly_typed=flavour.traits.strongly_typed_flag_needed)


def _parse(poly: ModuleType, flavour: Flavour, onnx_path: Path) -> tuple[Any, Any, Any]:
    """(builder, network, parser): the parser stays referenced, it owns the weights."""
    from polygraphy.exception import PolygraphyException

    try:
        return network_loader(poly, flavour, onnx_path)()
    except PolygraphyException as cause:
        raise UsageError(f"cannot build from {onnx_path.name}: {_parse_failure(flavour, onnx_path)}") from cause


def _parse_failure(flavour: Flavour, onnx_path: Path) -> str:
    """Why the ONNX parser refused the file, from its first error (Polygraphy only logs them)."""
    trt = flavour.module
    logger = trt_logger(trt)
    with capturing(logger):
        network = trt.Builder(logger).create_network(0)
        parser = trt.OnnxParser(network, logger)
        if parser.parse_from_file(str(onnx_path)) or parser.num_errors == 0:
            return "the ONNX parser failed without a message"
    error = parser.get_error(0)
    text = tidy_message(error.desc())
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


def _bind_profiles(network: Any, profiles: Sequence[Profile]) -> list[Profile]:
    """Each profile checked against the network's inputs and bound to their names."""
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
        for name, rng in profile.inputs.items():
            assert name is not None  # bind() named every range
            check_against_onnx_input(name, rng, [d if d >= 0 else None for d in dims[name]])
    return bound


def _polygraphy_profile(poly: ModuleType, profile: Profile) -> Any:
    out = poly.Profile()
    for name, rng in profile.inputs.items():
        out.add(name, rng.min, rng.opt, rng.max)
    return out


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


# --- the builder configuration -----------------------------------------------------------


def config_loader(poly: ModuleType, flavour: Flavour, builder: Any, profiles: Sequence[Profile],
                  options: BuildOptions, targets: Sequence[str], *, timing_cache: Path | None = None,
                  monitor: Any = None) -> Any:
    """Polygraphy's ``CreateConfig`` (``CreateConfigRTX`` for compute-capability targets) for a build.

    ``CreateConfig`` turns TF32 off and asks for detailed profiling unless told otherwise; a new
    ``IBuilderConfig`` of the backend says what TensorRT itself would do, and that is passed on,
    so a plan is the one TensorRT's defaults give.
    """
    trt = flavour.module
    fresh = builder.create_builder_config()
    kwargs: dict[str, Any] = {
        "profiles": [_polygraphy_profile(poly, p) for p in profiles],
        "profiling_verbosity": fresh.profiling_verbosity,
        "progress_monitor": monitor,
        "load_timing_cache": str(timing_cache) if timing_cache is not None else None,
    }
    if options.workspace_bytes is not None:
        kwargs["memory_pool_limits"] = {trt.MemoryPoolType.WORKSPACE: options.workspace_bytes}
    if options.optimization_level is not None:
        kwargs["builder_optimization_level"] = options.optimization_level
    if flavour.traits.supports_compute_capability_targets:
        from polygraphy.backend.tensorrt_rtx import CreateConfigRTX

        return CreateConfigRTX(compute_capabilities=[cc_tuple(cc) for cc in targets], **kwargs)
    tf32 = getattr(trt.BuilderFlag, "TF32", None)
    return poly.CreateConfig(tf32=tf32 is not None and fresh.get_flag(tf32), **kwargs)


def _check_config(config: Any, flavour: Flavour, profiles: Sequence[Profile], targets: Sequence[str],
                  logger: Any) -> None:
    """What Polygraphy does not check: every profile was taken, every target set."""
    added = config.num_optimization_profiles
    if profiles and added < len(profiles):
        reason = tidy_message(logger.errors[0]) if logger.errors else "invalid shapes"
        raise UsageError(f"profile {profiles[added]} was refused: {reason}")
    if flavour.traits.supports_compute_capability_targets:
        for index, cc in enumerate(targets):
            member = getattr(flavour.module.ComputeCapability, "SM" + cc.replace(".", ""))
            if index >= config.num_compute_capabilities or config.get_compute_capability(index) != member:
                raise CapabilityError(f"{flavour.label} refused target compute capability {cc}")


def _create_config(poly: ModuleType, flavour: Flavour, network: tuple, profiles: Sequence[Profile],
                   options: BuildOptions, targets: Sequence[str], timing_cache: Path | None,
                   say: Progress, logger: Any) -> tuple[Any, Any]:
    """(IBuilderConfig, progress monitor): the monitor must outlive the build."""
    from polygraphy.exception import PolygraphyException

    builder, trt_network = network[0], network[1]
    monitor = _progress_monitor(flavour.module, say)
    load = timing_cache if timing_cache is not None and timing_cache.is_file() and timing_cache.stat().st_size else None
    logger.errors.clear()
    try:
        config = config_loader(poly, flavour, builder, profiles, options, targets, timing_cache=load,
                               monitor=monitor)(builder, trt_network)
    except PolygraphyException as exc:  # an invalid profile, a setting this TensorRT lacks
        reason = tidy_message(logger.errors[0]) if logger.errors else first_line(exc)
        raise UsageError(f"{flavour.label} refused the build settings: {reason}") from exc
    except Exception:  # noqa: BLE001  a timing cache TensorRT cannot read
        if load is None:
            raise
        _safe_say(say, f"timing cache {load.name} is unusable here; starting a new one")
        load.unlink()
        return _create_config(poly, flavour, network, profiles, options, targets, timing_cache, say, logger)
    _check_config(config, flavour, profiles, targets, logger)
    if timing_cache is not None:
        _safe_say(say, f"timing cache: {'loaded ' + timing_cache.name if load else 'new'}")
    return config, monitor


# --- the build ------------------------------------------------------------------------


def _refused_target(errors: Sequence[str]) -> str | None:
    """"Cannot compile ... for Turing (SM75)" -> "7.5"."""
    for message in errors:
        match = re.search(r"\(SM(\d+)(\d)\)", message)
        if match:
            return f"{int(match.group(1))}.{match.group(2)}"
    return None


def _build_failure(flavour: Flavour, logger: Any) -> UsageError:
    errors = [e for e in logger.errors if e.strip()]
    reason = tidy_message(errors[0]) if errors else "no message from the builder"
    return UsageError(f"{flavour.label} could not build the engine: {reason}")


def build_engine(
    onnx_path: Path,
    profiles: list[Profile],
    flavour: Flavour,
    options: BuildOptions = BuildOptions(),
    timing_cache: Path | None = None,
    progress: Progress | None = None,
) -> BuildResult:
    """Build a raw engine plan from a (strongly typed) ONNX file.

    ``profiles``: one TensorRT optimization profile each; names may be unbound for a
    single-input model. ``timing_cache``: a file read (where it holds one) and rewritten, the
    new timings merged in, where the backend keeps one; TensorRT-RTX keeps none.
    """
    say = progress or (lambda _message: None)
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise UsageError(f"ONNX file not found: {onnx_path}")
    gpu = gpu_info()
    if flavour.traits.needs_gpu_to_build and gpu is None:
        raise CapabilityError(
            f"{flavour.label} needs an NVIDIA GPU to build; TensorRT-RTX builds without one "
            "(--trt tensorrt-rtx)"
        )
    targets = resolve_targets(flavour, options.target_cc, gpu)
    if timing_cache is not None and not flavour.traits.has_timing_cache:
        _safe_say(say, f"timing cache: {flavour.traits.label} keeps none, skipped")
        timing_cache = None
    poly = bind(flavour)
    logger = trt_logger(flavour.module)
    with capturing(logger), quiet_polygraphy(), warnings.catch_warnings():
        if not flavour.traits.has_timing_cache:
            warnings.filterwarnings("ignore", _RTX_TIMING_CACHE_WARNING, DeprecationWarning)
        _safe_say(say, f"parsing {onnx_path.name}")
        network = _parse(poly, flavour, onnx_path)
        io = network_io(network[1])
        bound = _bind_profiles(network[1], profiles)
        if _uses_fp8(flavour.module, network[1]) and fp8_unsupported(targets):
            require_fp8(targets, subject=f"{onnx_path.name} has FP8 tensors, which",
                        fix="choose --target-cc 8.9,12.0")
        plan, seconds, targets, dropped = _build(poly, flavour, network, bound, options, targets,
                                                 timing_cache, say, logger)
    _safe_say(say, f"built in {seconds:.1f} s, plan {len(plan) / 2**20:.1f} MiB")
    return BuildResult(
        plan=plan,
        build_seconds=seconds,
        io=io,
        backend=flavour.name,
        backend_version=flavour.version,
        targets=targets,
        gpu=gpu if flavour.traits.needs_gpu_to_build else None,
        options=options,
        profiles=bound,
        timing_cache_used=timing_cache is not None,
        dropped_targets=dropped,
    )


def _build(poly: ModuleType, flavour: Flavour, network: tuple, profiles: list[Profile], options: BuildOptions,
           targets: tuple[str, ...], timing_cache: Path | None, say: Progress,
           logger: Any) -> tuple[bytes, float, tuple[str, ...], tuple[str, ...]]:
    """(plan, seconds, targets built for, default targets dropped)."""
    from polygraphy.exception import PolygraphyException

    dropped: list[str] = []
    while True:
        config, monitor = _create_config(poly, flavour, network, profiles, options, targets, timing_cache,
                                         say, logger)
        where = f"compute capability {', '.join(targets)}" if targets else "this GPU"
        _safe_say(say, f"building with {flavour.label} for {where}")
        logger.errors.clear()
        started = time.perf_counter()
        try:
            save = str(timing_cache) if timing_cache is not None else None
            plan = poly.EngineBytesFromNetwork(network, config, save_timing_cache=save)()
        except PolygraphyException:
            plan = None
        seconds = time.perf_counter() - started
        del monitor  # referenced until the build ended
        if plan is not None:
            return bytes(memoryview(plan)), seconds, targets, tuple(dropped)
        # TensorRT-RTX cannot compile some layers for some architectures (FP32 GEMM on Turing).
        # Where the user named no targets, drop the one it names and build for the rest.
        refused = _refused_target(logger.errors)
        if options.target_cc is None and refused in targets and len(targets) > 1:
            reason = tidy_message(logger.errors[0])
            reporting.warning(f"compute capability {refused} dropped: {reason}")
            _safe_say(say, f"compute capability {refused} dropped: {reason}")
            dropped.append(refused)
            targets = tuple(t for t in targets if t != refused)
            continue
        raise _build_failure(flavour, logger)


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
    flavour: Flavour | None,
    built: BuiltFor | Mapping[str, Any],
    gpu: GpuInfo | None | Literal["detect"] = "detect",
) -> tuple[bool, str]:
    """Whether an engine (described by its manifest) runs with ``flavour`` on this GPU.

    ``flavour`` is the installed one (None: none installed). The reason is one line, fit to
    show in place of TensorRT's own deserialization error.
    """
    built = built if isinstance(built, BuiltFor) else BuiltFor.from_json(built)
    what = _built_label(built)
    row = TRAITS.get(built.backend)
    if row is None:
        return False, f"{what}: a TensorRT flavour enginekit does not know"
    if gpu == "detect":
        gpu = gpu_info()
    if gpu is None:
        return False, f"{what}; this machine has no GPU"
    if flavour is None:
        return False, f"{what}, but {row.label} is not installed: {row.pip_install}"
    if flavour.traits.family != row.family or flavour.version != built.version:
        # Plans carry a version tag: another TensorRT (or patch release) refuses them.
        return False, f"{what}, but {flavour.label} is installed: rebuild it with this one"
    if row.supports_compute_capability_targets:
        if gpu.compute_capability not in built.targets:
            return False, f"{what}; this machine's GPU, {gpu}, is not among them"
    elif built.gpu is not None and built.gpu.compute_capability != gpu.compute_capability:
        return False, f"{what}; this machine's GPU is {gpu}: rebuild it here"
    return True, f"{what}; runs on {gpu}"
