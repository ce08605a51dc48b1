"""``enginekit predict``'s request."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import field_validator

from enginekit.options import RANDOM_INIT, SEED
from enginekit.requests.common import _Declares, typed


class PredictRequest(_Declares):
    """``enginekit predict``: every frame of one or several sources through one or several models, on the streaming
    pipeline (``enginekit.flows.predict``). ``models``: a comma list (or a list) of names, files or cache keys;
    ``sources``: one or several (images, a folder, videos, camera indices: one frame of each per step); ``weights``:
    one per model, in order. The stream's settings (``drop`` ... ``pace``) are ``runtime.stream.StreamOptions``'s,
    checked there; ``declared``: what a torch model enginekit cannot know by itself declares (one model)."""

    models: str
    sources: list[str]
    save: Optional[Path] = None
    backend: str = "auto"
    precision: str = "fp32"
    weights: list[Path] = []
    random_init: typed(RANDOM_INIT)
    seed: typed(SEED)
    conf: float = 0.25
    iou: float = 0.7
    max_frames: Optional[int] = None
    device: Optional[str] = None
    gpu_letterbox: bool = False
    imgsz: Optional[str] = None
    drop: str = "none"
    queue: int = 2
    every: dict[str, int] = {}
    frames_per_step: int = 1
    batch: Optional[int] = None
    in_flight: int = 2
    pace: Optional[float] = None

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, value: Any) -> Any:
        return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else value

    @field_validator("sources", mode="before")
    @classmethod
    def _sources(cls, value: Any) -> Any:
        return [str(value)] if isinstance(value, (str, Path, int)) else [str(v) for v in value]

    @field_validator("imgsz", mode="before")
    @classmethod
    def _imgsz_text(cls, value: Any) -> Any:
        return None if value is None else str(value)
