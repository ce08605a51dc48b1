"""Which ModelOpt and ONNX Runtime this package was written against: the version gate every use of their internals passes first (``check()``: one line naming what is installed and what is needed).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from collections.abc import Iterator, Sequence
from importlib import metadata

from enginekit.errors import CapabilityError


# Release series this module was written against: distribution -> accepted "major.minor" prefixes.
MODELOPT_SERIES = ("0.47",)


ONNXRUNTIME_SERIES = ("1.24", "1.31")


# The internals used, as (module, attribute): each must exist for INT8 to work as written.
INTERNALS = (
    ("modelopt.onnx.quantization.ort_patching", "_select_tensors_to_calibrate"),
    ("modelopt.onnx.quantization.ort_patching", "load_model_with_shape_infer"),
    ("modelopt.onnx.quantization.int8", "quantize_static"),
    ("onnxruntime.quantization.calibrate", "create_calibrator"),
    ("onnxruntime.quantization.calibrate", "CalibrationMethod"),
    ("onnxruntime.quantization.calibrate", "TensorData"),
    ("onnxruntime.quantization.calibrate", "TensorsData"),
    ("onnxruntime.quantization.quant_utils", "compute_scale_zp"),
    ("onnxruntime.quantization.quant_utils", "get_qmin_qmax_for_qType"),
)


_PIN = "pip install 'nvidia-modelopt[onnx]==0.47.*'"


# The calibrator swap is process-wide: one quantize call at a time.
_HOOK_LOCK = threading.Lock()


def _version(*distributions: str) -> tuple[str, str | None]:
    """(distribution, version) of the first installed one; version None when none is."""
    for name in distributions:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return distributions[0], None


def _in_series(version: str | None, series: Sequence[str]) -> bool:
    return version is not None and any(version == s or version.startswith(s + ".") for s in series)


def installed() -> dict[str, str | None]:
    """``{"nvidia-modelopt": "0.47.0", "onnxruntime-gpu": "1.24.4"}``: what check() judges."""
    modelopt = _version("nvidia-modelopt")
    ort = _version("onnxruntime-gpu", "onnxruntime")
    return dict([modelopt, ort])


def problem(versions: dict[str, str | None] | None = None, probe: bool = True) -> str | None:
    """Why INT8 cannot run as written here, in one line; None when it can."""
    versions = installed() if versions is None else versions
    found = ", ".join(f"{name} {version or 'not installed'}" for name, version in versions.items())
    wanted = (f"nvidia-modelopt {' or '.join(s + '.x' for s in MODELOPT_SERIES)} with onnxruntime "
              f"{' or '.join(s + '.x' for s in ONNXRUNTIME_SERIES)}")
    modelopt_version = versions.get("nvidia-modelopt")
    ort_version = next((v for k, v in versions.items() if k.startswith("onnxruntime")), None)
    if not (_in_series(modelopt_version, MODELOPT_SERIES) and _in_series(ort_version, ONNXRUNTIME_SERIES)):
        return f"INT8 quantization is written for {wanted}; installed: {found} ({_PIN})"
    if probe:
        for module, name in INTERNALS:
            try:
                present = hasattr(importlib.import_module(module), name)
            except ImportError as exc:  # a broken install, not a version: say what is missing
                return f"INT8 quantization cannot import {module}: {exc} ({_PIN})"
            if not present:
                return (f"INT8 quantization needs {module}.{name}, which {found} lack"
                        f"{'s' if len(versions) == 1 else ''} ({_PIN})")
    return None


@functools.lru_cache(maxsize=1)
def _checked() -> str | None:
    return problem()


def check() -> None:
    """CapabilityError (one line, naming the versions) unless the internals below are usable."""
    reason = _checked()
    if reason is not None:
        raise CapabilityError(reason)


@contextlib.contextmanager
def swapped(patches, lock) -> Iterator[None]:
    """Each ``(owner, name, replacement)`` of ``patches`` set for the length of the block, under ``lock`` (the
    swaps are process-wide: one at a time), and the originals put back after, whatever happens."""
    with lock:
        originals = [(owner, name, vars(owner)[name]) for owner, name, _ in patches]
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        try:
            yield
        finally:
            for owner, name, original in originals:
                setattr(owner, name, original)


def missing_internal(internals) -> str | None:
    """The first ``(module, name)`` of ``internals`` that is not there (or a module that does not import), as one
    phrase; None when every one is: where a shortcut stands aside and ModelOpt runs its own way."""
    for module, name in internals:
        try:
            if not hasattr(importlib.import_module(module), name):
                return f"{module}.{name} is missing"
        except ImportError as exc:
            return f"cannot import {module}: {exc}"
    return None
