"""Every use of ModelOpt's and ONNX Runtime's internals, in one place, version-checked.

The INT8 stage keeps calibration ranges as a TensorRT calibration cache and hands ModelOpt's
quantizer the very ranges a cache holds. ModelOpt has no public hook for that, so this module
reaches into it: ModelOpt's tensor selection for calibration (a private function), its call of
ONNX Runtime's static quantization (swapped for the length of a call), ONNX Runtime's calibrator
factory, and ONNX Runtime's scale arithmetic. Those are written for the versions in ``WRITTEN_FOR``;
``check()`` refuses any other with one line naming what is installed and what is needed, before
any work starts, instead of a traceback from deep inside a quantizer.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

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
_AUTOCAST_LOCK = threading.Lock()  # the AutoCast swap: one conversion at a time


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


# --- the internals -----------------------------------------------------------------------------


def tensors_to_calibrate(model_path: Path, nodes: Sequence[str]) -> set[str]:
    """The tensors ModelOpt's calibrator would measure for ``nodes``, found as it finds them."""
    from types import SimpleNamespace

    from modelopt.onnx.quantization.ort_patching import _select_tensors_to_calibrate, load_model_with_shape_infer

    model = load_model_with_shape_infer(model_path)
    tensors, _ = _select_tensors_to_calibrate(SimpleNamespace(op_types_to_calibrate=list(nodes)), model)
    return set(tensors)


@contextlib.contextmanager
def calibrator_factory(make: Callable) -> Iterator[None]:
    """Make ModelOpt's INT8 pass get its calibrator from ``make(real_factory, *args, **kwargs)``.

    ModelOpt re-installs its own ORT calibrator factory on every quantize call, so the factory
    is swapped inside ModelOpt's call of ORT's static quantization, then put back.
    """
    check()
    from modelopt.onnx.quantization import int8 as modelopt_int8
    from onnxruntime.quantization import calibrate as ort_calibrate

    original = modelopt_int8.quantize_static

    def quantize_static(*args, **kwargs):
        make_real = ort_calibrate.create_calibrator
        ort_calibrate.create_calibrator = lambda *a, **k: make(make_real, *a, **k)
        try:
            return original(*args, **kwargs)
        finally:
            ort_calibrate.create_calibrator = make_real

    with _HOOK_LOCK:
        modelopt_int8.quantize_static = quantize_static
        try:
            yield
        finally:
            modelopt_int8.quantize_static = original


@contextlib.contextmanager
def stable_subgraph_nodes() -> Iterator[None]:
    """Let AutoCast convert graphs holding a Loop or If (graphs ending in NMS hold one per image).

    AutoCast 0.47 keys its decision for each node of a control-flow body by ``id(node)``, over
    several passes of ``for node in subgraph.node``; protobuf makes a new Python object for a node
    each time the last one is dropped, so a later pass misses (``KeyError``). Holding every body
    node for the length of the call keeps one object, and so one id, per node.
    """
    try:
        from modelopt.onnx.autocast.precisionconverter import PrecisionConverter
    except ImportError:
        yield
        return
    original = getattr(PrecisionConverter, "_convert_subgraph_precision", None)
    if original is None:  # another release: nothing to hold
        yield
        return

    def convert(self, subgraph, *args, **kwargs):
        alive = list(subgraph.node)  # noqa: F841 - held, not read
        return original(self, subgraph, *args, **kwargs)

    with _AUTOCAST_LOCK:
        PrecisionConverter._convert_subgraph_precision = convert
        try:
            yield
        finally:
            PrecisionConverter._convert_subgraph_precision = original


def ort_int8_scale(amax) -> np.float32:
    """The scale ONNX Runtime's quantizer computes for a symmetric INT8 range [-amax, amax]."""
    import onnx
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(onnx.TensorProto.INT8, symmetric=True)
    amax = np.float32(amax)
    return np.float32(compute_scale_zp(-amax, amax, qmin, qmax, symmetric=True)[1])


def symmetric_ranges(amaxes: dict[str, np.float32]):
    """ONNX Runtime's calibration result holding [-amax, amax] per tensor, in the given order."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    return TensorsData(CalibrationMethod.MinMax,
                       {name: TensorData(lowest=-amax, highest=amax) for name, amax in amaxes.items()})


def calibration_eps() -> list[str]:
    """ModelOpt's names for the ORT providers: CUDA only where a GPU exists (see backends.providers)."""
    from enginekit.onnx.runtime import providers

    return ["cuda:0", "cpu"] if "CUDAExecutionProvider" in providers() else ["cpu"]
