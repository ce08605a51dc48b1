"""``enginekit tune``'s request."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from enginekit import precisions
from enginekit.errors import UsageError
from enginekit.backends import names
from enginekit.families import resolve
from enginekit.fsutil import check_output_path
from enginekit.model import ModelRequest
from enginekit.options import RANDOM_INIT, SEED
from enginekit.requests.common import _Declares, _items, _positive_ints, image_size, milliseconds, typed


class TuneRequest(_Declares):
    """``enginekit tune``: the settings of one or several models that meet a frame budget on this machine.

    Targets (at least one): ``p50``/``p95``/``p99`` in milliseconds per step (``25``, ``"25ms"``) and
    ``fps``. The search space: ``backends``, ``precisions``, ``inputs`` (``320`` or ``HxW``) and ``batches``
    (frames per inference call, at most ``frames_per_step``); empty: the defaults (``flows.tune``). An input
    ``MODEL=SIZE`` (``depth=224``) is that model's only; plain sizes go to the models no such item names."""

    models: list[str]
    weights: list[Optional[Path]] = []  # per model, in the order of ``models`` (None: random init)
    random_init: typed(RANDOM_INIT)
    seed: typed(SEED)
    p50: Optional[float] = None
    p95: Optional[float] = None
    p99: Optional[float] = None
    fps: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    frames_per_step: int = Field(1, ge=1)
    every: dict[str, int] = {}
    backends: list[str] = []
    precisions: list[str] = []
    inputs: list[str] = []
    batches: list[int] = []
    budget_minutes: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    source: Optional[str] = None  # a video, folder or camera; None: a video made from the embedded photographs
    frames: int = Field(60, ge=4)  # timed steps per candidate
    device: Optional[str] = None
    write_recipe: Optional[Path] = None

    @model_validator(mode="after")
    def _declares_one_model(self):
        if self.declared and len(self.models) > 1:
            raise UsageError(f"{', '.join(f'--{k}' for k in self.declared)} declare one model; {','.join(self.models)} "
                             f"names {len(self.models)}: tune the declared model alone, or a graph exported with the declaration")
        return self

    @field_validator("models", "backends", "precisions", "inputs", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> list[str]:
        return _items(value)

    @field_validator("batches", mode="before")
    @classmethod
    def _batches(cls, value: Any) -> list[int]:
        return _positive_ints(value, "--batch {}: expected positive whole numbers, e.g. 1,2")

    @field_validator("p50", "p95", "p99", mode="before")
    @classmethod
    def _ms(cls, value: Any, info) -> Optional[float]:
        ms = milliseconds(value, f"--{info.field_name}")
        if ms is not None and not (0 < ms < float("inf")):
            raise UsageError(f"--{info.field_name} {value}: expected a time above 0 ms")
        return ms

    @field_validator("models")
    @classmethod
    def _models(cls, value: list[str]) -> list[str]:
        if not value:
            raise UsageError("no model given: e.g. enginekit tune yolo12n --random-init --p99 25ms")
        if len(set(value)) != len(value):
            raise UsageError(f"{','.join(value)}: a model is named twice")
        for name in value:
            resolve(name)
        return value

    @field_validator("backends")
    @classmethod
    def _backends(cls, value: list[str]) -> list[str]:
        for b in value:
            if b not in names():
                raise UsageError(f"unknown backend {b!r}: choose from {', '.join(names())}")
        return list(dict.fromkeys(value))

    @field_validator("precisions")
    @classmethod
    def _precisions(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(precisions.get(p).name for p in value))

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: list[str]) -> list[str]:
        out = []
        for item in value:
            model, sep, size = item.rpartition("=")
            text = "x".join(map(str, image_size(size)))
            out.append(f"{model.strip()}={text}" if sep else text)
        return list(dict.fromkeys(out))

    @field_validator("every")
    @classmethod
    def _every(cls, value: dict[str, int]) -> dict[str, int]:
        for name, n in value.items():
            if n < 1:
                raise UsageError(f"--every {name}={n}: expected a positive whole number")
        return value

    @field_validator("write_recipe")
    @classmethod
    def _recipe(cls, value: Optional[Path]) -> Optional[Path]:
        if value is not None:
            folder = Path(value).suffix.lower() not in (".yaml", ".yml")
            check_output_path(value, "--write-recipe", folder=folder)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "TuneRequest":
        if not any(v is not None for v in (self.p50, self.p95, self.p99, self.fps)):
            raise UsageError("no target: give at least one of --p50, --p95, --p99 (milliseconds) or --fps")
        if len(self.weights) > len(self.models):
            raise UsageError(f"{len(self.weights)} --weights for {len(self.models)} model(s): one per model, in order")
        for i in range(len(self.models)):
            self.model_request(i)  # a weights file that is missing or unreadable: refused now
            self.sizes(i)  # sizes the model does not take (YOLO: multiples of 32), and names no model has
        named = {item.rpartition("=")[0] for item in self.inputs if "=" in item}
        unknown = [n for n in named if not any(n in self._aliases(i) for i in range(len(self.models)))]
        if unknown:
            raise UsageError(f"--input {unknown[0]}=...: no such model here (models: {', '.join(self.models)})")
        too_big = [b for b in self.batches if b > self.frames_per_step]
        if too_big:
            raise UsageError(f"--batch {too_big[0]}: a step's frames are batched, and a step holds "
                             f"{self.frames_per_step} (--frames-per-step)")
        if self.write_recipe is not None and len(self.models) > 1 and \
                Path(self.write_recipe).suffix.lower() in (".yaml", ".yml"):
            raise UsageError(f"--write-recipe {self.write_recipe}: {len(self.models)} models write one recipe each; "
                             "give a folder")
        return self

    def weights_of(self, index: int) -> Optional[Path]:
        return self.weights[index] if index < len(self.weights) else None

    def _aliases(self, index: int) -> set[str]:
        adapter = resolve(self.models[index])
        return {self.models[index], adapter.variant, adapter.family}

    def sizes(self, index: int) -> list[tuple[int, int]]:
        """The ``index``-th model's input sizes (H, W): its own ``MODEL=SIZE`` items, else the plain ones, else
        the family's default; each checked against what the model takes."""
        adapter = resolve(self.models[index])
        aliases = self._aliases(index)
        own = [item.rpartition("=")[2] for item in self.inputs if item.rpartition("=")[0] in aliases]
        plain = [item for item in self.inputs if "=" not in item]
        sizes = [image_size(t) for t in (own or plain)] or [tuple(adapter.default_input[2:])]
        channels = int(adapter.default_input[1])
        for h, w in sizes:
            try:
                adapter.constraint.check((1, channels, h, w), what="--input")
            except UsageError as exc:
                hint = "" if own or len(self.models) == 1 else \
                    f" (give each model its own: --input {self.models[index]}=SIZE)"
                raise UsageError(f"{exc}{hint}") from exc
        return sizes

    def model_request(self, index: int):
        """The ``enginekit.model.ModelRequest`` of the ``index``-th model: its --weights, else random init
        (with --random-init) or the family's published weights."""
        w = self.weights_of(index)
        return ModelRequest(self.models[index], w, self.random_init and w is None, self.seed, declared=dict(self.declared))
