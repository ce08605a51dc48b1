"""ModelOpt's tensor selection for calibration and ONNX Runtime's calibrator factory and scale arithmetic: how the INT8 stage hands ModelOpt's quantizer the ranges a TensorRT calibration cache holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from enginekit.onnx.runtime import providers
from enginekit.stages.modelopt.versions import _HOOK_LOCK, check


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
    return ["cuda:0", "cpu"] if "CUDAExecutionProvider" in providers() else ["cpu"]
