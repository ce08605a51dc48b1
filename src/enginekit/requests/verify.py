"""``enginekit verify``'s request: the engines and graphs to judge, and how a model name is built or found."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from enginekit import precisions
from enginekit.compare.tolerances import Tolerances
from enginekit.errors import UsageError
from enginekit.requests.common import Options, _output, tolerances
from enginekit.requests.build import BuildRequest


class VerifyRequest(Options):
    """``enginekit verify``: engines and their ONNX artifacts against the PyTorch reference.

    ``target``: None (every engine in the cache), a cache key (prefix), a model name (built or
    found with ``build``), or an ONNX file with ``reference`` (its PyTorch checkpoint).
    ``build_options`` (BuildRequest names) is accepted in place of ``build``.
    """

    target: Optional[str] = None
    precision: Optional[str] = None
    images: Optional[Path] = None
    #: photographs the gates run on (None: 4, or with ``data`` and no ``images`` 16 of the labelled split)
    image_count: Optional[int] = Field(None, ge=1)
    report_dir: Optional[Path] = None
    junit: Optional[Path] = None
    tolerances: Tolerances = Tolerances()  # --tol
    reference: Optional[Path] = None
    model: Optional[str] = None
    require_engine: bool = False
    #: False: a reference with nothing to compare on the photographs (random-weight detectors)
    #: is reported as not compared instead of failing the task gate; parity is gated as always
    task_required: bool = True
    #: every cached engine (no target): an engine built from an ONNX file, with no PyTorch model to compare
    #: against, is listed as not checked instead of failing the run
    allow_unverifiable: bool = False
    build: Optional[BuildRequest] = None
    #: labels to score every candidate and the FP32 PyTorch model against: an Ultralytics dataset YAML or a
    #: folder of images with YOLO labels (``--data``); its split and how many of its images (spread evenly)
    data: Optional[Path] = None
    data_split: Optional[str] = None  # None: val
    data_limit: Optional[int] = Field(None, ge=1)
    recheck: bool = False  # check again although verdicts on the same content are stored

    @model_validator(mode="before")
    @classmethod
    def _build_options(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "build_options" not in data:
            return data
        data = dict(data)
        options = dict(data.pop("build_options") or {})
        target = data.get("target")
        kind = _target_kind(target, data.get("reference"))
        if kind == "model":
            names = _precision_list(data.get("precision") or "fp32")
            # calibration flags with a list (``fp16,int8 --calib-data imgs/``) are the calibrated precision's
            calibrating = any(options.get(k) for k in CALIBRATION_OPTIONS)
            precision = next((p for p in names if precisions.get(p).calibrated), names[0]) if calibrating else names[0]
            data["build"] = BuildRequest(target=target, precision=precision, **options)
        elif kind == "engine":  # an engine file's checkpoint: --weights and --reference say the same
            if data.get("reference") is not None and options.get("weights") is not None:
                raise UsageError("--reference and --weights name the same checkpoint: pass one")
            if options.get("weights") is not None:
                data["reference"] = options["weights"]
        elif kind == "onnx" and target is not None:  # the weights (or seed) to compare the file against
            if data.get("reference") is not None and options.get("weights") is not None:
                raise UsageError("--reference and --weights name the same checkpoint: pass one")
            data["build"] = BuildRequest(target=target, precision=data.get("precision") or "fp32", **options)
        return data

    @field_validator("data")
    @classmethod
    def _data(cls, value: Optional[Path]) -> Optional[Path]:
        if value is not None and not Path(value).exists():
            raise UsageError(f"--data: dataset not found: {value}")
        return value

    @field_validator("tolerances", mode="before")
    @classmethod
    def _tolerances(cls, value: Any) -> Tolerances:
        return tolerances(value)

    @model_validator(mode="after")
    def _build_matches(self) -> "VerifyRequest":
        b = self.build
        # the build request stands for one of the precisions asked for (a calibrated one where it calibrates)
        asked = self.precisions or [b.precision] if b is not None else []
        if b is not None and (b.target != self.target or b.precision not in asked):
            raise UsageError(f"verify {self.target} {self.precision or ''} does not match its build request "
                             f"({b.target} {b.precision})".replace("  ", " "))
        if len(self.precisions) > 1 and self.kind != "model":
            raise UsageError(f"--precision {self.precision}: a list of precisions needs a model name (each its engine)")
        if self.data is None:
            given = [f for f, v in (("--data-split", self.data_split), ("--data-limit", self.data_limit)) if v is not None]
            if given:
                raise UsageError(f"{' and '.join(given)}: chooses what --data scores, and no --data was given")
        return self

    @field_validator("precision")
    @classmethod
    def _precision(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else ",".join(_precision_list(value))

    @property
    def precisions(self) -> list[str]:
        """The precisions asked for (``--precision fp16,int8``), in order; [] where none was."""
        return _precision_list(self.precision) if self.precision else []

    @field_validator("report_dir")
    @classmethod
    def _report_dir(cls, value: Optional[Path]) -> Optional[Path]:
        return _output(value, "--report", folder=True)

    @field_validator("junit")
    @classmethod
    def _junit(cls, value: Optional[Path]) -> Optional[Path]:
        return _output(value, "--junit")

    @property
    def kind(self) -> str:
        """all | key | model | onnx | engine: what ``target`` names."""
        return _target_kind(self.target, self.reference)

    @property
    def build_request(self) -> BuildRequest:
        """How a model-name target is built (or found in the cache): its first precision."""
        if self.build is not None:
            return self.build
        return BuildRequest(target=self.target, precision=(self.precisions or ["fp32"])[0])

    @property
    def build_requests(self) -> list[BuildRequest]:
        """One build per precision asked for (``--precision fp16,int8``), the same flags otherwise."""
        first = self.build_request

        def at(precision: str) -> BuildRequest:
            if precision == first.precision:
                return first
            changes: dict[str, Any] = {"precision": precision}
            if not precisions.get(precision).calibrated:  # the calibration flags are the calibrated builds'
                changes.update({k: BuildRequest.model_fields[k].get_default(call_default_factory=True)
                                for k in (*CALIBRATION_OPTIONS, "calib_count")})
            return first.replace(**changes)

        return [at(p) for p in (self.precisions or [first.precision])]


#: BuildRequest fields that only a calibrated precision (int8, fp8) takes
CALIBRATION_OPTIONS = ("calib_data", "calib_cache", "calib_method", "exclude")


def _precision_list(value: str) -> list[str]:
    """``"fp16,int8"`` -> ["fp16", "int8"]: each a known precision, none twice."""
    names = [precisions.get(p.strip()).name for p in str(value).split(",") if p.strip()]
    if not names:
        raise UsageError(f"--precision {value!r}: name a precision ({', '.join(precisions.NAMES)})")
    if len(set(names)) != len(names):
        raise UsageError(f"--precision {value}: a precision is named twice")
    return names


def _target_kind(target: Optional[str], reference: Any) -> str:
    if target is None:
        return "all"
    if target.endswith((".engine", ".plan")):
        return "engine"
    if target.endswith(".onnx") or reference is not None:
        return "onnx"
    if re.fullmatch(r"[0-9a-f]{6,64}", target):
        return "key"
    return "model"
