"""``enginekit deploy triton``'s request."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from enginekit.errors import UsageError
from enginekit.model import check_weights_choice
from enginekit.options import RANDOM_INIT, SEED, WEIGHTS
from enginekit.requests.common import _Declares, _choice, _items, _positive_ints, typed


#: how a Triton server runs the network (``deploy triton --platform``): its TensorRT backend, its ONNX Runtime
#: backend, or its Python backend with enginekit's runtime inside
TRITON_PLATFORMS = ("onnxruntime", "tensorrt", "python")


class DeployRequest(_Declares):
    """``enginekit deploy triton``: a Triton model repository for one model (``enginekit.flows.deploy``).

    ``target``: a model name or recipe (exported or built through the cache, parity-checked), or an ONNX file
    enginekit wrote. ``platform``: how the server runs the network (``tensorrt``, ``onnxruntime``, or
    ``python``: enginekit's ONNX Runtime session inside Triton's Python backend). ``max_batch``: the most
    requests the server gathers into one network call; ``preferred``: batch sizes it waits to form
    (default: a recipe's ``runtime.batch``); ``instances``: copies of each model."""

    target: str
    repo: Path
    platform: str = "onnxruntime"
    precision: str = "fp32"
    name: Optional[str] = None
    max_batch: int = Field(8, ge=1, le=4096)
    preferred: list[int] = []
    queue_delay_us: int = Field(2000, ge=0, le=10_000_000)
    instances: int = Field(1, ge=1, le=256)
    imgsz: Optional[str] = None
    conf: float = Field(0.25, ge=0, le=1, allow_inf_nan=False)
    iou: float = Field(0.7, ge=0, le=1, allow_inf_nan=False)
    weights: typed(WEIGHTS)
    random_init: typed(RANDOM_INIT)
    seed: typed(SEED)
    profiles: list[str] = []  # tensorrt: the engine's profiles (MIN:OPT:MAX); default: batch 1 to max_batch
    python_env: Optional[Path] = None  # the environment the Python models run in (default: this one)
    allow_unverified: bool = False

    @field_validator("platform")
    @classmethod
    def _platform(cls, value: str) -> str:
        return _choice(value, TRITON_PLATFORMS, "--platform")

    @field_validator("preferred", mode="before")
    @classmethod
    def _preferred(cls, value: Any) -> list[int]:
        return _positive_ints(value, "--preferred {}: expected positive whole numbers, e.g. 4,8")

    @field_validator("profiles", mode="before")
    @classmethod
    def _profiles(cls, value: Any) -> list[str]:
        return _items(value)

    @field_validator("name")
    @classmethod
    def _name(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}", value):
            raise UsageError(f"--name {value!r}: a Triton model name is letters, digits, '_', '.' and '-' "
                             "(a folder of the repository)")
        return value

    @model_validator(mode="after")
    def _checks(self):
        if self.weights is not None or self.random_init:
            check_weights_choice(self.weights, self.random_init)
        big = [b for b in self.preferred if b > self.max_batch]
        if big:
            raise UsageError(f"--preferred {','.join(map(str, big))}: above --max-batch {self.max_batch}")
        if self.profiles and self.platform != "tensorrt":
            raise UsageError(f"--profile shapes a TensorRT engine: it has no effect with --platform {self.platform}")
        return self
