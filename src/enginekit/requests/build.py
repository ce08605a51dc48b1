"""``enginekit build``'s request."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import field_validator, model_validator

from enginekit import precisions
from enginekit.compare.tolerances import Tolerances
from enginekit.errors import UsageError
from enginekit.families.torch_models.sources import PROGRAM_SUFFIXES
from enginekit.options import (CALIB_CACHE, CALIB_COUNT, CALIB_DATA, CALIB_METHOD, EXCLUDE, OPSET, OPT_LEVEL, PROFILES,
                               TARGET_CC, TRT, WORKSPACE)
from enginekit.requests.common import _ModelOptions, _imgsz_into, _output, flavour_from_backend, tolerances, typed


class BuildRequest(_ModelOptions):
    """``enginekit build``: a model name or an ONNX file -> a cached engine."""

    target: str
    profiles: typed(PROFILES)
    precision: str = "fp32"
    #: the TensorRT flavour that builds (``--trt``): auto, tensorrt or tensorrt-rtx; ``backend=`` is its old name
    flavour: typed(TRT)
    target_cc: typed(TARGET_CC)
    workspace: typed(WORKSPACE)
    opt_level: typed(OPT_LEVEL)
    calib_data: typed(CALIB_DATA)
    calib_count: typed(CALIB_COUNT)
    calib_method: typed(CALIB_METHOD)  # None: the family's (ModelAdapter.int8_calibration)
    calib_cache: typed(CALIB_CACHE)
    exclude: typed(EXCLUDE)
    opset: typed(OPSET)
    force: bool = False
    explain: bool = False
    verify: bool = True
    repair: bool = False
    tolerances: Tolerances = Tolerances()  # --tol: the gates of --repair
    #: photographs the build's verdict is judged on; None: --calib-data's images it did not calibrate on, else embedded
    images: Optional[Path] = None
    #: build from a graph whose record holds a failed check (the engine's manifest keeps the override and the check)
    accept_failed: bool = False

    @model_validator(mode="before")
    @classmethod
    def _imgsz(cls, data: Any) -> Any:
        """``imgsz`` (``320`` or ``384x640``) is a profile of batch 1 at that size."""
        return _imgsz_into(data, "profiles", lambda shape: [shape])

    @field_validator("tolerances", mode="before")
    @classmethod
    def _tolerances(cls, value: Any) -> Tolerances:
        return tolerances(value)

    @field_validator("precision")
    @classmethod
    def _precision(cls, value: str) -> str:
        return precisions.get(value).name

    @model_validator(mode="before")
    @classmethod
    def _backend_is_flavour(cls, data: Any) -> Any:
        """``backend=`` (the old name of ``flavour``, one release) is read as ``flavour``."""
        return flavour_from_backend(data)

    @field_validator("calib_cache")
    @classmethod
    def _calib_cache(cls, value: Optional[Path]) -> Optional[Path]:
        # read when it is a file, else written: refused up front when it cannot be (a folder, no access, a FIFO);
        # a file (unlike an output folder) goes into a folder that exists: a typo in it is not made a folder
        if value is None or Path(value).is_file():
            return value
        parent = Path(value).expanduser().parent
        if not parent.is_dir():
            raise UsageError(f"--calib-cache {value}: {parent} {'is not a folder' if parent.exists() else 'does not exist'}"
                             " (the cache file is written into a folder that exists)")
        return _output(value, "--calib-cache")

    @model_validator(mode="after")
    def _repair_needs(self) -> "BuildRequest":
        if self.repair and (self.is_file or not precisions.get(self.precision).repairable):
            can = " and ".join(precisions.names(repairable=True))
            raise UsageError(f"--repair works on {can} builds of a model name (it needs the PyTorch reference)")
        if self.tolerances and not self.verify and not self.repair:
            # --tol sets the gates the build judges its graph by (and what --repair keeps): none without them
            raise UsageError("--tol sets the gates the build judges its graph by: drop --no-verify, or give --tol "
                             "to `enginekit verify`")
        mode = precisions.get(self.precision)
        if not mode.calibrated:
            given = [flag for flag, value in (("--calib-data", self.calib_data), ("--calib-cache", self.calib_cache),
                                              ("--calib-method", self.calib_method), ("--exclude", self.exclude))
                     if value]
            if "calib_count" in self.model_fields_set and self.calib_count != 8:
                given.append("--calib-count")
            if given:
                calibrated = ", ".join(precisions.names(calibrated=True))
                raise UsageError(f"{', '.join(given)} calibrate{'s' if len(given) == 1 else ''} {calibrated} builds; "
                                 f"a {self.precision} build has nothing to calibrate: drop "
                                 f"{'it' if len(given) == 1 else 'them'} or build --precision int8")
        if self.nms and self.is_file:
            raise UsageError("--nms applies to a model name: an ONNX file is built as it is (export it with --nms)")
        return self

    @property
    def is_file(self) -> bool:
        """An ONNX file rather than a model name (a saved PyTorch program is a model: torch.export, TorchScript)."""
        path = Path(self.target)
        return self.target.endswith(".onnx") or (path.is_file() and path.suffix.lower() not in PROGRAM_SUFFIXES)

    @property
    def target_ccs(self) -> Optional[tuple[str, ...]]:
        if not self.target_cc:
            return None
        return tuple(t.strip() for t in self.target_cc.split(",") if t.strip())

    @property
    def model_request(self):
        return self.model_for(self.target)
