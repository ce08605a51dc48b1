"""The only code in enginekit that imports tensorrt or tensorrt_rtx (and only on demand), directly or
through Polygraphy's TensorRT backend.

``flavours``: which TensorRT flavour (TensorRT 10, 11, TensorRT-RTX) is installed and what it can do; the
GPU of this machine; compute-capability targets. ``binding``: Polygraphy's TensorRT backend bound to the flavour
in use, TensorRT's log into ``enginekit.reporting``. ``builder``: ONNX -> raw engine plan through
Polygraphy's loaders, and whether a built engine can run here. ``timing``: TensorRT 10/11 timing
caches kept in the cache per GPU. ``runner``, ``session``: running a plan.
"""

from __future__ import annotations

from enginekit.trt.flavours import (
    PORTABLE_RTX_TARGETS,
    TRAITS,
    Flavour,
    FlavourTraits,
    GpuInfo,
    default_targets,
    fp8_supported,
    gpu_info,
    require_fp8,
    resolve_flavour,
    resolve_targets,
    validate_targets,
)
from enginekit.trt.builder import BuildOptions, BuildResult, BuiltFor, build_engine, can_run_here

__all__ = [
    "PORTABLE_RTX_TARGETS",
    "TRAITS",
    "Flavour",
    "FlavourTraits",
    "BuildOptions",
    "BuildResult",
    "BuiltFor",
    "GpuInfo",
    "build_engine",
    "can_run_here",
    "default_targets",
    "fp8_supported",
    "gpu_info",
    "require_fp8",
    "resolve_flavour",
    "resolve_targets",
    "validate_targets",
]
