"""What to do, as one validated object per verb: ExportRequest, BuildRequest, VerifyRequest, TuneRequest,
PredictRequest, DeployRequest, BenchRequest (a module per verb; ``common`` holds what they share).

Every option lives here once, with its validation. The CLI parses flags into a request, a
recipe produces requests, and the Python API takes a request or the same names as keywords::

    enginekit.build("yolo12n", precision="fp16", random_init=True)
    enginekit.build(BuildRequest(target="yolo12n", precision="fp16", random_init=True))

A bad value is a one-line ``UsageError`` naming the option (``--calib-count: ...``), raised
before any work. Checks that need the machine (GPU, TensorRT) stay with the flows.
"""

from __future__ import annotations

from enginekit.requests.common import (SIMPLIFIERS, Options, check_types, coerce, declaration_fields,
                                       flavour_from_backend, image_size, milliseconds, renamed, tolerance_names,
                                       tolerances, typed, unknown_name, workspace_bytes)
from enginekit.requests.export import ExportRequest
from enginekit.requests.build import BuildRequest
from enginekit.requests.verify import CALIBRATION_OPTIONS, VerifyRequest, _target_kind
from enginekit.requests.tune import TuneRequest
from enginekit.requests.predict import PredictRequest
from enginekit.requests.deploy import TRITON_PLATFORMS, DeployRequest
from enginekit.requests.bench import PLOT_SUFFIXES, BenchRequest

__all__ = ["BenchRequest", "BuildRequest", "CALIBRATION_OPTIONS", "DeployRequest", "ExportRequest", "Options",
           "PLOT_SUFFIXES", "PredictRequest", "SIMPLIFIERS", "TRITON_PLATFORMS", "TuneRequest", "VerifyRequest",
           "_target_kind", "check_types", "coerce", "declaration_fields", "flavour_from_backend", "image_size",
           "milliseconds", "renamed", "tolerance_names", "tolerances", "typed", "unknown_name", "workspace_bytes"]
