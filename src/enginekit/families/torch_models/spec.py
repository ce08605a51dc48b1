"""What a user declares about a PyTorch model enginekit cannot know by itself, once.

The task its outputs serve, the outputs' names and meaning, its input size and dynamic axes, and how a
photograph becomes its input (mean/std, resize, channel order): ``--task``, ``--outputs``, ``--size``,
``--dynamic``, ``--mean``/``--std``, ``--resize``, ``--bgr``, ``--classes`` on the command line, the same
keys in a recipe's ``model:`` section, or keywords of ``enginekit.load``. torchvision's and timm's common
heads come declared (``families.torch_models.table``); what a user writes overrides them.

Validating a declaration imports no torch: requests and recipes check it before any work.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from enginekit.errors import UsageError

TASKS = ("semantic", "classify", "depth", "raw")
#: what an output holds: per-pixel or per-image class ``logits`` (softmax gives probabilities),
#: ``probabilities``, a ``depth`` map, or ``values`` (compared by parity only)
MEANINGS = ("logits", "probabilities", "depth", "values")
RESIZES = ("stretch", "letterbox", "crop")
AXES = ("batch", "height", "width")
#: the flag (or recipe key) of each field, for messages
FLAGS = {"task": "--task", "outputs": "--outputs", "size": "--size", "dynamic": "--dynamic", "mean": "--mean",
         "std": "--std", "resize": "--resize", "channels": "--bgr", "classes": "--classes"}
#: the meaning each task reads from its first output
TASK_MEANINGS = {"semantic": ("logits", "probabilities"), "classify": ("logits", "probabilities"),
                 "depth": ("depth", "values"), "raw": MEANINGS}


def _triple(value: Any, what: str) -> Optional[tuple[float, float, float]]:
    if value is None:
        return None
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value.strip()) if v]
    try:
        items = tuple(float(v) for v in value)
    except (TypeError, ValueError) as cause:
        raise ValueError(f"expected three numbers R,G,B, got {value!r}") from cause
    if len(items) != 3 or not all(v == v and abs(v) != float("inf") for v in items):
        raise ValueError(f"expected three finite numbers R,G,B, got {value!r}")
    if what == "std" and not all(v > 0 for v in items):
        raise ValueError(f"every std must be above 0, got {value!r}")
    return items  # type: ignore[return-value]


class ModelSpec(BaseModel):
    """A declaration; every field None where the user said nothing (the table's or the default then)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: Optional[Literal["semantic", "classify", "depth", "raw"]] = None
    #: output names in the graph's order, each with its meaning (the first is the task's)
    outputs: Optional[tuple[tuple[str, str], ...]] = None
    #: the input's H x W when none is given (``--input``, ``--profile``), and the runtime's
    size: Optional[tuple[int, int]] = None
    #: axes of the input that stay symbolic in the graph (batch always; height and width where declared)
    dynamic: Optional[tuple[str, ...]] = None
    mean: Optional[tuple[float, float, float]] = None  # of 0..1 pixels, per channel
    std: Optional[tuple[float, float, float]] = None
    resize: Optional[Literal["stretch", "letterbox", "crop"]] = None
    channels: Optional[Literal["rgb", "bgr"]] = None
    #: the number of classes the model is built with (torchvision's and timm's ``num_classes``)
    classes: Optional[int] = None

    @field_validator("outputs", mode="before")
    @classmethod
    def _outputs(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if isinstance(value, dict):
            value = list(value.items())
        pairs = []
        for item in value:
            if isinstance(item, str):
                name, _, meaning = item.strip().partition(":")
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                name, meaning = item
            else:
                raise ValueError(f"expected NAME[:MEANING] items, got {item!r}")
            name, meaning = str(name).strip(), str(meaning or "values").strip()
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", name):
                raise ValueError(f"output name {name!r} is not a plain name (letters, digits, _ . -)")
            if meaning not in MEANINGS:
                raise ValueError(f"output {name}: unknown meaning {meaning!r}: choose {', '.join(MEANINGS)}")
            pairs.append((name, meaning))
        if not pairs:
            raise ValueError("names no output")
        names = [n for n, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"an output is named twice ({', '.join(names)})")
        return tuple(pairs)

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value, value)
        elif isinstance(value, str):
            parts = re.split(r"[x,]", value.strip().lower())
            value = tuple(parts) if len(parts) == 2 else (parts[0], parts[0]) if len(parts) == 1 else parts
        try:
            h, w = (int(v) for v in value)
        except (TypeError, ValueError) as cause:
            raise ValueError(f"expected HxW (or one side), got {value!r}") from cause
        if not (1 <= h <= 16384 and 1 <= w <= 16384):
            raise ValueError(f"sides must be 1 to 16384 pixels, got {h}x{w}")
        return (h, w)

    @field_validator("dynamic", mode="before")
    @classmethod
    def _dynamic(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            value = [v for v in re.split(r"[,\s]+", value.strip().lower()) if v]
        items = list(value)
        if items in (["none"], ["static"]):
            items = []
        if "hw" in items:
            items = [a for a in items if a != "hw"] + ["height", "width"]
        unknown = [a for a in items if a not in AXES]
        if unknown:
            raise ValueError(f"unknown axis {unknown[0]!r}: choose from batch, height, width (or hw, none)")
        # batch stays symbolic always: every graph is proven at batch 1 and 2 and built for a batch range
        return tuple(a for a in AXES if a in items or a == "batch")

    @field_validator("mean", mode="before")
    @classmethod
    def _mean(cls, value: Any) -> Any:
        return _triple(value, "mean")

    @field_validator("std", mode="before")
    @classmethod
    def _std(cls, value: Any) -> Any:
        return _triple(value, "std")

    @field_validator("classes")
    @classmethod
    def _classes(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and not 1 <= value <= 1_000_000:
            raise ValueError(f"expected 1 to 1000000 classes, got {value}")
        return value

    # -- combining ------------------------------------------------------------------------------
    @classmethod
    def of(cls, value: Any) -> "ModelSpec":
        """A declaration from a ModelSpec, a mapping of its fields (None: nothing declared), or JSON text.
        Bad values are one UsageError naming the flag."""
        if isinstance(value, ModelSpec):
            return value
        if value is None or value == {}:
            return cls()
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except ValueError as cause:
                raise UsageError(f"a model declaration is not JSON: {value[:80]!r}") from cause
        if not isinstance(value, dict):
            raise UsageError(f"a model declaration is a mapping of {', '.join(FLAGS)}; got {type(value).__name__}")
        try:
            return cls(**{k: v for k, v in value.items() if v is not None})
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else "declaration"
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                raise UsageError(f"unknown model declaration {field!r}: choose {', '.join(FLAGS)}") from exc
            if error["type"].startswith("literal_error"):
                message += f" (got {error.get('input')!r})"
            raise UsageError(f"{FLAGS.get(field, field)}: {message[0].lower() + message[1:]}") from exc

    def given(self) -> dict[str, Any]:
        """The fields the user set, as JSON-ready values (what requests, keys and metadata carry)."""
        data = self.model_dump(mode="json", exclude_none=True)
        if "outputs" in data:
            data["outputs"] = [f"{n}:{m}" for n, m in data["outputs"]]
        if "size" in data:
            data["size"] = f"{data['size'][0]}x{data['size'][1]}"
        if "dynamic" in data:
            data["dynamic"] = ",".join(data["dynamic"]) or "none"
        return data

    def over(self, base: "ModelSpec") -> "ModelSpec":
        """This declaration with ``base`` filling what it leaves unsaid."""
        merged = base.model_dump()
        merged.update({k: v for k, v in self.model_dump().items() if v is not None})
        return ModelSpec(**merged)

    def __bool__(self) -> bool:
        return any(v is not None for v in self.model_dump().values())


def declaration(**given: Any) -> dict[str, Any]:
    """The declaration fields among keyword arguments (CLI flags, ``enginekit.load`` keywords), validated
    and JSON-ready; {} where none is given. ``bgr=True`` is ``channels="bgr"``."""
    if given.pop("bgr", None):
        given["channels"] = "bgr"
    return ModelSpec.of({k: v for k, v in given.items() if k in FLAGS and v is not None}).given()
