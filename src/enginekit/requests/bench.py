"""``enginekit bench``'s request."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from enginekit.errors import UsageError
from enginekit.backends.registry import parse_backends
from enginekit.families.registry import resolve_any
from enginekit.model import check_weights_choice
from enginekit.options import RANDOM_INIT, SEED, WEIGHTS
from enginekit.requests.common import Options, _imgsz_into, _items, _output, _positive_ints, typed


class BenchRequest(Options):
    """``enginekit bench``: latency and throughput of one model (or several, each timed, and with ``e2e`` or
    ``stream`` their pipeline) on the runners that run here, fed the same seeded inputs (``enginekit.bench``)."""

    models: list[str]
    batches: list[int] = []  # --batch 1,8,16; empty: the N of ``input``, else 1
    input: Optional[str] = None  # HxW, CxHxW or NxCxHxW; None: the family's
    precision: str = "fp32"  # of the ONNX graphs and engines (torch rows name their own)
    backends: list[str] = []  # runners (torch-fp16, onnxruntime-cpu...) or words for several (torch, ort); []: bench's
    warmup: int = 10
    iters: int = 50
    include_copies: bool = False
    threads: Optional[int] = None
    e2e: bool = False  # per frame through enginekit.load beside the network-only rows
    image: Optional[Path] = None  # e2e's photograph (default: one an installed package ships)
    stream: bool = False  # stream a video through the runtime's pipeline
    source: Optional[str] = None  # stream's video, folder or camera (default: one made from the photographs)
    every: list[str] = []  # stream: MODEL=N, a model's cadence
    frames_per_step: int = Field(1, ge=1)
    drop: str = "none"
    in_flight: int = Field(2, ge=1)
    plot: Optional[Path] = None  # a PNG (SVG, PDF, JPEG) of latency and throughput against batch size
    weights: typed(WEIGHTS)
    random_init: typed(RANDOM_INIT)
    seed: typed(SEED)

    @model_validator(mode="before")
    @classmethod
    def _imgsz(cls, data: Any) -> Any:
        """``imgsz`` (``640`` or ``384x640``) is ``input`` of batch 1; both given is refused."""
        return _imgsz_into(data, "input", lambda shape: shape)

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, value: Any) -> list[str]:
        return list(dict.fromkeys(_items(value)))

    @field_validator("backends", mode="before")
    @classmethod
    def _backends(cls, value: Any) -> list[str]:
        """Runner names and words for several (``torch,ort``) -> runner names in report order."""
        if isinstance(value, str):  # as --backend gives it: a list that names none is refused
            return parse_backends(value)
        return parse_backends(",".join(_items(value))) if _items(value) else []

    @field_validator("batches", mode="before")
    @classmethod
    def _batches(cls, value: Any) -> list[int]:
        return _positive_ints(value, "malformed --batch {}: expected positive integers like 1,8,16")

    @field_validator("every", mode="before")
    @classmethod
    def _every(cls, value: Any) -> Any:
        if isinstance(value, dict):  # {"depth": 3}, as predict and tune take it
            return [f"{k}={v}" for k, v in value.items()]
        return [] if value is None else value

    @field_validator("plot")
    @classmethod
    def _plot(cls, value: Optional[Path]) -> Optional[Path]:
        if value is not None:
            _output(value, "--plot")
            if value.suffix.lower() not in PLOT_SUFFIXES:
                raise UsageError(f"--plot {value}: give a picture file name ending in {', '.join(PLOT_SUFFIXES)}")
        return value

    @model_validator(mode="after")
    def _belongs(self) -> "BenchRequest":
        if not self.models:
            raise UsageError("no model given: e.g. enginekit bench yolo12n")
        for model in self.models:
            resolve_any(model)  # a name, a checkpoint or an ONNX file
        if len(self.models) > 1 and (self.plot is not None or self.weights is not None):
            raise UsageError(f"--{'plot' if self.plot is not None else 'weights'} takes one model, not {len(self.models)}")
        if self.image is not None and not self.e2e:
            raise UsageError("--image is the photograph --e2e decodes: add --e2e")
        if not self.stream:
            given = [flag for flag, value in (("--source", self.source), ("--every", self.every)) if value]
            if given:
                raise UsageError(f"{given[0]} belongs to --stream: add --stream")
        elif self.source is not None and not self.source.isdigit() and not Path(self.source).exists():
            raise UsageError(f"--source {self.source}: not found (a video, a folder of images or a camera index)")
        check_weights_choice(self.weights, self.random_init)
        return self


PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")
