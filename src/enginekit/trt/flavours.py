"""Which TensorRT is installed, what it can do, and which compute capabilities an engine is for.

The differences between TensorRT 10, TensorRT 11 and TensorRT-RTX live in one table of
data (``TRAITS``), so the build code asks questions ("does this backend keep a timing
cache?") instead of comparing version numbers. Nothing here imports tensorrt or
tensorrt_rtx at import time: ``resolve_flavour`` imports the chosen module on demand.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType

from enginekit.errors import CapabilityError, UsageError, first_line
from enginekit.gpu import GpuInfo, gpu_info  # noqa: F401 - re-exported: the GPU an engine is for
from enginekit.precisions import PRECISIONS

PIP_TENSORRT = "pip install tensorrt-cu13"
PIP_TENSORRT_RTX = "pip install tensorrt-rtx tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings"

# TensorRT-RTX 1.7 targets (its ComputeCapability enum). Hopper (9.0) is not among them.
RTX_COMPUTE_CAPABILITIES = ("7.5", "8.0", "8.6", "8.9", "12.0", "12.1")
# Built when no target is given and no supported GPU is present: one engine that runs on
# every consumer generation from Turing to Blackwell (12.1 is the GB10 only, so opt-in).
PORTABLE_RTX_TARGETS = ("7.5", "8.0", "8.6", "8.9", "12.0")
# FP8 tensor cores arrived with Ada (8.9); every later architecture has them.
FP8_MIN_COMPUTE_CAPABILITY = PRECISIONS["fp8"].min_compute_capability

FLAVOURS = ("auto", "tensorrt", "tensorrt-rtx")


@dataclass(frozen=True)
class FlavourTraits:
    """What one backend (a module at some major versions) can and cannot do."""

    name: str  # row name, recorded in manifests and cache keys: "tensorrt-10"
    family: str  # what --trt names: "tensorrt" or "tensorrt-rtx"
    label: str  # for messages: "TensorRT", "TensorRT-RTX"
    module: str  # import name
    majors: tuple[int, ...]  # module major versions this row describes
    pip_install: str
    strongly_typed_flag_needed: bool  # create_network must pass STRONGLY_TYPED
    strongly_typed_is_default: bool  # create_network(0) already gives a strongly typed network
    has_weak_typing_flags: bool  # BuilderFlag.FP16/INT8/BF16/FP8 exist (enginekit never sets them)
    has_timing_cache: bool  # a timing cache changes (speeds up) later builds
    needs_gpu_to_build: bool  # the builder times kernels on the GPU it runs on
    supports_compute_capability_targets: bool  # IBuilderConfig.set_compute_capability
    compute_capabilities: tuple[str, ...]  # targets it accepts; empty: builds for the local GPU
    supports_hardware_compatibility: bool  # hardware_compatibility_level (AMPERE_PLUS) is honoured
    supports_version_compatibility: bool  # BuilderFlag.VERSION_COMPATIBLE builds
    workspace_via_memory_pool_limit: bool  # set_memory_pool_limit(WORKSPACE), not max_workspace_size
    can_deserialize_without_gpu: bool  # Runtime.deserialize_cuda_engine works with no GPU
    #: builds ONNX NonMaxSuppression (the parser's INMSLayer): graphs of other tools; enginekit's
    #: own --nms graphs suppress in ordinary operators (families.graph_nms) and need no such layer
    builds_nms: bool = True


TRAITS: dict[str, FlavourTraits] = {
    t.name: t
    for t in (
        FlavourTraits(
            name="tensorrt-10",
            family="tensorrt",
            label="TensorRT",
            module="tensorrt",
            majors=(10,),
            pip_install=PIP_TENSORRT,
            strongly_typed_flag_needed=True,  # weak typing is still the default in 10.x
            strongly_typed_is_default=False,
            has_weak_typing_flags=True,  # deprecated since 10.12, still present
            has_timing_cache=True,
            needs_gpu_to_build=True,
            supports_compute_capability_targets=False,
            compute_capabilities=(),
            supports_hardware_compatibility=True,
            supports_version_compatibility=True,
            workspace_via_memory_pool_limit=True,
            can_deserialize_without_gpu=False,
            builds_nms=True,  # the ONNX parser's INMSLayer and INonZeroLayer
        ),
        FlavourTraits(
            name="tensorrt-11",
            family="tensorrt",
            label="TensorRT",
            module="tensorrt",
            majors=(11,),
            pip_install=PIP_TENSORRT,
            strongly_typed_flag_needed=False,  # always strongly typed; the flag is accepted and ignored
            strongly_typed_is_default=True,
            has_weak_typing_flags=False,  # removed in 11.0: precision lives in the ONNX graph
            has_timing_cache=True,
            needs_gpu_to_build=True,
            supports_compute_capability_targets=False,
            compute_capabilities=(),
            supports_hardware_compatibility=True,
            supports_version_compatibility=True,
            workspace_via_memory_pool_limit=True,
            can_deserialize_without_gpu=False,
            builds_nms=True,  # the ONNX parser's INMSLayer and INonZeroLayer
        ),
        FlavourTraits(
            name="tensorrt-rtx",
            family="tensorrt-rtx",
            label="TensorRT-RTX",
            module="tensorrt_rtx",
            majors=(1,),
            pip_install=PIP_TENSORRT_RTX,
            strongly_typed_flag_needed=False,  # the flag exists, but create_network(0) is strongly typed
            strongly_typed_is_default=True,
            has_weak_typing_flags=False,
            has_timing_cache=False,  # its timing-cache calls are deprecated no-ops
            needs_gpu_to_build=False,  # builds ahead of time for chosen compute capabilities
            supports_compute_capability_targets=True,
            compute_capabilities=RTX_COMPUTE_CAPABILITIES,
            supports_hardware_compatibility=False,  # setting it only logs "unsupported"
            supports_version_compatibility=False,  # the flag exists; the build needs a lean runtime it lacks
            workspace_via_memory_pool_limit=True,
            can_deserialize_without_gpu=False,  # deserializing creates a CUDA stream
            # 1.7: the parser makes an INMSLayer, but the builder has no implementation of it
            # ("NonMaxSuppression has no runners that implement it", for every target, even a
            # one-layer network), and NonZero becomes a plugin it does not ship
            builds_nms=False,
        ),
    )
}


@dataclass(frozen=True)
class Flavour:
    """An installed, imported backend: its row in the table and its module."""

    name: str
    version: str
    traits: FlavourTraits
    module: ModuleType = field(repr=False, compare=False)

    @property
    def label(self) -> str:
        """``"TensorRT-RTX 1.7.1.116"``: for messages."""
        return f"{self.traits.label} {self.version}"

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version}


# --- backend selection ---------------------------------------------------------------


def _import(module_name: str) -> ModuleType:
    """Import a backend module; a broken install counts as not installed."""
    try:
        return importlib.import_module(module_name)
    except (ImportError, OSError) as exc:  # OSError: the wheel is there, its libraries are not
        raise ModuleNotFoundError(str(exc)) from exc


def _family_traits(family: str) -> list[FlavourTraits]:
    return [t for t in TRAITS.values() if t.family == family]


def _row_for(family: str, version: str) -> FlavourTraits:
    """Pick the row of ``family`` that describes this module version."""
    rows = _family_traits(family)
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = -1
    for row in rows:
        if major in row.majors:
            return row
    newest = max(rows, key=lambda r: max(r.majors))
    if major > max(newest.majors):
        # A newer major than the table knows: assume it keeps the newest known behaviour.
        return newest
    oldest = min(min(r.majors) for r in rows)
    raise CapabilityError(
        f"{rows[0].label} {version} is installed, but enginekit needs {rows[0].label} "
        f"{oldest} or newer: {rows[0].pip_install}"
    )


def _load(family: str) -> Flavour:
    """Import one family's module and wrap it; ModuleNotFoundError when absent."""
    module_name = _family_traits(family)[0].module
    module = _import(module_name)
    version = str(getattr(module, "__version__", "0"))
    row = _row_for(family, version)
    return Flavour(name=row.name, version=version, traits=row, module=module)


def resolve_flavour(requested: str = "auto") -> Flavour:
    """``"auto" | "tensorrt" | "tensorrt-rtx"`` -> the installed backend.

    ``auto`` takes TensorRT when it is installed and can build here (a GPU is present),
    else TensorRT-RTX, else TensorRT all the same (its build then says a GPU is missing).
    """
    if requested not in FLAVOURS:
        raise UsageError(f"unknown TensorRT flavour {requested!r}: choose one of {', '.join(FLAVOURS)}")
    if requested != "auto":
        try:
            return _load(requested)
        except ModuleNotFoundError as exc:
            row = _family_traits(requested)[0]
            raise CapabilityError(
                f"TensorRT flavour {requested} is not installed ({row.module}: {first_line(exc)}); "
                f"install it with: {row.pip_install}"
            ) from exc
    found: dict[str, Flavour] = {}
    for family in ("tensorrt", "tensorrt-rtx"):
        try:
            found[family] = _load(family)
        except ModuleNotFoundError:
            continue
        # TensorRT proper cannot build without a GPU; TensorRT-RTX can.
        if family == "tensorrt" and gpu_info() is not None:
            return found[family]
    if "tensorrt-rtx" in found:
        return found["tensorrt-rtx"]
    if "tensorrt" in found:
        return found["tensorrt"]
    raise CapabilityError(
        "no TensorRT backend is installed: install TensorRT-RTX (builds without a GPU) with: "
        f"{PIP_TENSORRT_RTX}; or TensorRT with: {PIP_TENSORRT}"
    )


# --- compute-capability targets ------------------------------------------------------


def cc_tuple(cc: str) -> tuple[int, int]:
    major, minor = cc.split(".")
    return int(major), int(minor)


def normalize_cc(text: str) -> str:
    """``"8.6"``, ``"sm86"``, ``"sm_86"`` -> ``"8.6"``; UsageError for anything else."""
    value = text.strip().lower()
    match = re.fullmatch(r"(\d+)\.(\d)", value) or re.fullmatch(r"sm_?(\d+)(\d)", value)
    if not match:
        raise UsageError(f"malformed compute capability {text!r}: write it like 8.6 (or sm86)")
    return f"{int(match.group(1))}.{match.group(2)}"


def default_targets(flavour: Flavour, gpu: GpuInfo | None) -> tuple[str, ...]:
    """Targets when the user names none: this GPU if the backend can target it, else portable.

    TensorRT proper always builds for the GPU it runs on, so its "targets" only record it.
    """
    if not flavour.traits.supports_compute_capability_targets:
        return (gpu.compute_capability,) if gpu else ()
    if gpu is not None and gpu.compute_capability in flavour.traits.compute_capabilities:
        return (gpu.compute_capability,)
    return PORTABLE_RTX_TARGETS


def validate_targets(
    flavour: Flavour, requested: str | Sequence[str], gpu: GpuInfo | None = None
) -> tuple[str, ...]:
    """``--target-cc 8.6,8.9,12.0`` -> sorted, de-duplicated targets the backend supports."""
    items = requested.split(",") if isinstance(requested, str) else list(requested)
    targets = sorted({normalize_cc(item) for item in items if item.strip()}, key=cc_tuple)
    if not targets:
        raise UsageError("--target-cc names no compute capability: write it like 8.6,8.9,12.0")
    traits = flavour.traits
    if not traits.supports_compute_capability_targets:
        if gpu is not None and targets == [gpu.compute_capability]:
            return tuple(targets)
        here = f"this GPU ({gpu})" if gpu else "the GPU it runs on"
        raise UsageError(
            f"{traits.label} builds only for {here}; --target-cc {','.join(targets)} "
            "needs --trt tensorrt-rtx"
        )
    unsupported = [t for t in targets if t not in traits.compute_capabilities]
    if unsupported:
        raise UsageError(
            f"{flavour.label} cannot target compute capability {', '.join(unsupported)}; "
            f"supported: {', '.join(traits.compute_capabilities)}"
        )
    return tuple(targets)


def resolve_targets(
    flavour: Flavour, requested: str | Sequence[str] | None, gpu: GpuInfo | None
) -> tuple[str, ...]:
    """The targets a build uses: the validated request, or the defaults."""
    if requested is None or (not isinstance(requested, str) and len(requested) == 0):
        return default_targets(flavour, gpu)
    return validate_targets(flavour, requested, gpu)


def require_nms(flavour: "Flavour", what: str) -> None:
    """Refuse, before any work, a graph ending in NMS on a backend that cannot build it."""
    if not flavour.traits.builds_nms:
        raise CapabilityError(f"{flavour.label} cannot build {what}: its builder has no NonMaxSuppression layer; "
                              "build it with --trt tensorrt (TensorRT 10/11), or run the ONNX graph")


def fp8_unsupported(targets: Sequence[str]) -> list[str]:
    """The targets among ``targets`` that have no FP8 (compute capability below 8.9)."""
    return [t for t in targets if cc_tuple(t) < FP8_MIN_COMPUTE_CAPABILITY]


def fp8_supported(targets: Sequence[str]) -> bool:
    """True when every target runs FP8 (an empty list knows no GPU: False)."""
    return bool(targets) and not fp8_unsupported(targets)


def require_fp8(
    targets: Sequence[str],
    *,
    subject: str = "fp8",
    no_targets: str = "this machine (no GPU)",
    fix: str = "build for --target-cc 8.9,12.0 (TensorRT-RTX)",
) -> None:
    """The one FP8 capability check: UsageError naming the targets that cannot run FP8.

    ``subject`` says what needs FP8 ("fp8", "model.onnx has FP8 tensors, which"), ``no_targets``
    what an empty target list stands for, ``fix`` how to get a build that can.
    """
    lacking = fp8_unsupported(targets) if targets else [no_targets]
    if lacking:
        raise UsageError(
            f"{subject} needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
            f"target(s) {', '.join(lacking)} lack it: {fix}"
        )



def plan_family(magic: bytes) -> str:
    """The TensorRT family (``--trt``) that wrote a plan, by its first four bytes (TensorRT-RTX's are ``vtrt``)."""
    return "tensorrt-rtx" if magic == b"vtrt" else "tensorrt"
