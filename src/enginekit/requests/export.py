"""``enginekit export``'s request."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from enginekit.errors import UsageError
from enginekit.shapes import parse_shape
from enginekit.options import OPSET
from enginekit.requests.common import _ModelOptions, SIMPLIFIERS, _choice, _imgsz_into, _output, typed


class ExportRequest(_ModelOptions):
    """``enginekit export``: PyTorch -> simplified ONNX (and FP16), parity-checked."""

    model: str
    input: Optional[str] = None  # NxCxHxW; default: the family's
    fp16: bool = False
    output: Optional[Path] = None
    opset: typed(OPSET)
    simplifier: str = "onnxsim"
    images: Optional[Path] = None
    rel_l2: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    force: bool = False
    recheck: bool = False  # check parity again although a verdict on the same content is stored
    #: the size as ``--imgsz`` gave it (``1080x1920``), which messages about the input name; None: ``--input``'s
    imgsz_given: Optional[str] = None

    @model_validator(mode="before")
    @classmethod
    def _imgsz(cls, data: Any) -> Any:
        """``imgsz`` (Ultralytics' word: ``320`` or ``384x640``) is the input at batch 1."""
        given = data.get("imgsz") if isinstance(data, dict) else None
        data = _imgsz_into(data, "input", lambda shape: shape)
        if given is not None:
            data["imgsz_given"] = str(given)
        return data

    @field_validator("simplifier")
    @classmethod
    def _simplifier(cls, value: str) -> str:
        return _choice(value, SIMPLIFIERS, "simplifier")

    @field_validator("model")
    @classmethod
    def _not_a_graph(cls, value: str) -> str:
        """An ONNX file is exported already: build makes its FP16 or INT8 graph (and engine)."""
        if Path(value).suffix.lower() == ".onnx":
            raise UsageError(f"{Path(value).name} is an ONNX graph already (export makes graphs of PyTorch models): "
                             f"enginekit build {value} --precision fp16 makes its FP16 graph and engine, and prints "
                             "where they are")
        return value

    @field_validator("output")
    @classmethod
    def _output(cls, value: Optional[Path]) -> Optional[Path]:
        return _output(value, "--output")

    @field_validator("input")
    @classmethod
    def _shape(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            parse_shape(value, what="--input")
        return value

    @property
    def model_request(self):
        return self.model_for(self.model)
