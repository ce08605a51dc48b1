"""Every use of ModelOpt's and ONNX Runtime's internals, in one place, version-checked.

The INT8 stage keeps calibration ranges as a TensorRT calibration cache and hands ModelOpt's
quantizer the very ranges a cache holds. ModelOpt has no public hook for that, so this module
reaches into it: ModelOpt's tensor selection for calibration (a private function), its call of
ONNX Runtime's static quantization (swapped for the length of a call), ONNX Runtime's calibrator
factory, and ONNX Runtime's scale arithmetic. Those are written for the versions in
``MODELOPT_SERIES`` and ``ONNXRUNTIME_SERIES``; ``check()`` refuses any other with one line naming
what is installed and what is needed, before any work starts, instead of a traceback from deep
inside a quantizer.

Cold builds: ``autocast()`` and ``quantize_shortcuts()`` swap in, for the length of one call,
faster versions of the parts of AutoCast and of ModelOpt's INT8 pass where their time goes, each
giving what the original gives (tests/test_fp16_autocast.py, tests/test_int8.py). On any other
release they stand aside and ModelOpt runs its own way, as it does with
``ENGINEKIT_MODELOPT_SHORTCUTS=0``.

By concept: ``versions`` (the gate), ``calibration`` (ranges from a calibration cache into ModelOpt's quantizer),
``fp16`` (AutoCast's shortcut), ``quantize`` (the INT8/FP8 shortcut).
"""

from __future__ import annotations

from enginekit.stages.modelopt.fp16 import (SHORTCUTS_ENV, AutocastRun, autocast, marked_tensor_names,
                                                range_statistics, shortcuts_allowed)
from enginekit.stages.modelopt.calibration import (calibration_eps, calibrator_factory, ort_int8_scale,
                                                   symmetric_ranges, tensors_to_calibrate)
from enginekit.stages.modelopt.quantize import QuantizeRun, quantize_shortcuts
from enginekit.stages.modelopt.versions import INTERNALS, MODELOPT_SERIES, ONNXRUNTIME_SERIES, check, installed, problem

__all__ = ["INTERNALS", "MODELOPT_SERIES", "ONNXRUNTIME_SERIES", "SHORTCUTS_ENV", "AutocastRun", "QuantizeRun", "autocast",
           "calibration_eps", "calibrator_factory", "check", "installed", "marked_tensor_names", "ort_int8_scale",
           "problem", "quantize_shortcuts", "range_statistics", "shortcuts_allowed", "symmetric_ranges",
           "tensors_to_calibrate"]
