"""What every verb's request shares: the base model that turns a pydantic error into one ``UsageError`` naming its
option, the typed fields of ``options.py``, and the parsers of sizes, lists and times."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated, Any, Callable, Optional

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from enginekit.compare.tolerances import Tolerances
from enginekit.errors import UsageError
from enginekit.families import registered
from enginekit.families.torch_models.spec import ModelSpec
from enginekit.fsutil import check_output_path
from enginekit.model import ModelRequest, check_weights_choice
from enginekit.shapes import parse_shape
from enginekit.options import BY_FIELD, NMS, RANDOM_INIT, SEED, WEIGHTS, Option, workspace_problem
from enginekit.units import parse_size


SIMPLIFIERS = ("onnxsim", "onnxslim")


def _output(value: Any, what: str, *, folder: bool = False) -> Any:
    """An output path that cannot be written is refused before any work."""
    if value is not None:
        check_output_path(value, what, folder=folder)
    return value


def workspace_bytes(text: str, what: str = "--workspace") -> int:
    """A builder workspace limit (``"4G"``) in bytes: more than 0, at most what TensorRT takes."""
    problem = workspace_problem(text)
    if problem:
        raise UsageError(f"{what} {text}: {problem}")
    return parse_size(text)


def _checked(option: Option) -> Callable[[Any], Any]:
    """``option``'s check as a pydantic validator: its ValueError becomes an error of type ``option`` whose message is
    the check's own (a request's error names the flag, a recipe's the key)."""
    def check(value: Any) -> Any:
        try:
            return option.check(value)
        except ValueError as exc:
            raise PydanticCustomError("option", "{message}", {"message": str(exc)}) from exc

    return check


def typed(option: Option, *, as_text: bool = False) -> Any:
    """The type of a field that holds ``option`` (``options.py``): its type, default, limits and check.
    ``as_text``: a path kept as written (a recipe's, relative to its file)."""
    kind = Optional[str] if as_text and option.is_path else option.type
    extras: list[Any] = [Field(option.default, **option.limits)]
    if getattr(kind, "__origin__", None) is list:  # checked item by item (an error names the item: exclude[1])
        item = kind.__args__[0]
        kind = list[Annotated[item, AfterValidator(_checked(option))]] if option.check else kind
        extras.insert(0, BeforeValidator(lambda v: [] if v is None else list(v) if isinstance(v, tuple) else v))
    elif option.check is not None:
        extras.append(AfterValidator(_checked(option)))
    return Annotated[(kind, *extras)]


def _choice(value: Any, choices: tuple[str, ...], what: str) -> Any:
    if value is not None and value not in choices:
        raise UsageError(f"unknown {what} {value!r}: choose {', '.join(choices)}")
    return value


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def unknown_name(name: str, known) -> str:
    """``unknown option 'precison' (did you mean 'precision'?)``: a keyword no verb takes, with the closest it does."""
    import difflib

    close = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.6)
    return f"unknown option {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def _one_line(exc: ValidationError, known=()) -> str:
    error = exc.errors()[0]
    loc = [str(p) for p in error["loc"] if not isinstance(p, int)]
    where = (BY_FIELD[loc[-1]].flag if loc[-1] in BY_FIELD else _flag(loc[-1])) if loc else "options"
    if error["type"] == "extra_forbidden":
        return unknown_name(loc[-1], known) if loc else "unknown option"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    message = message[0].lower() + message[1:]
    if error["type"] not in ("missing", "value_error", "option"):
        message += f" (got {error.get('input')!r})"
    return f"{where}: {message}"


class Options(BaseModel):
    """Unknown names are refused; any invalid value is one UsageError naming its option."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise UsageError(_one_line(exc, type(self).model_fields)) from exc

    def replace(self, **changes: Any):
        """A copy with ``changes``, validated again."""
        return type(self)(**{**self.model_dump(exclude_unset=False), **changes})


def declaration_fields(value: Any) -> dict:
    """A model's declaration (``--task``, ``--classes``...: ``families.torch_models.spec.ModelSpec``), validated:
    the fields that were set."""
    return ModelSpec.of(value).given()


class _Declares(Options):
    """A request for a model the user may declare: ``declared`` holds what the user declares of a model enginekit
    cannot know by itself (``--task``, ``--outputs``, ``--size``, ``--dynamic``, ``--mean``/``--std``,
    ``--resize``, ``--bgr``, ``--classes``): the fields of ``families.torch_models.spec.ModelSpec`` that were set."""

    declared: dict = {}

    @field_validator("declared", mode="before")
    @classmethod
    def _declared(cls, value: Any) -> dict:
        return declaration_fields(value)


class _ModelOptions(_Declares):
    """Weights options shared by the verbs that may load a PyTorch model."""

    weights: typed(WEIGHTS)
    random_init: typed(RANDOM_INIT)
    seed: typed(SEED)
    #: NMS in the graph, as Ultralytics' ``nms=True`` export: detectors without an end-to-end head
    nms: typed(NMS)

    @model_validator(mode="after")
    def _weights_or_random(self):
        check_weights_choice(self.weights, self.random_init)
        return self

    def model_for(self, name: str):
        """The ``enginekit.model.ModelRequest`` of model ``name`` with these weights options (resolves
        the family; checks the weights file exists)."""
        return ModelRequest(name, self.weights, self.random_init, self.seed, self.nms, dict(self.declared))


@lru_cache(maxsize=1)
def tolerance_names() -> tuple[str, ...]:
    """Task metrics and options a ``--tol`` may set: every registered family's (besides the parity limits)."""
    classes = registered()
    metrics = {m for cls in classes for per in getattr(cls, "task_gates", {}).values() for m in per}
    options = {o for cls in classes for o in getattr(cls, "task_options", {})}
    if metrics & {"recall", "precision"}:  # share gates rest on a number of detections (compare.comparison)
        options.add("min_detections")
    return tuple(sorted(metrics | options))


def tolerances(value: Any) -> Tolerances:
    """``--tol`` items (or a Tolerances) -> Tolerances, names checked against every family's."""
    if isinstance(value, Tolerances):
        return value
    return Tolerances.coerce(value, tolerance_names())


def renamed(data: Any, old: str, new: str, *, disagree: Callable[[Any, Any], Exception],
            said: Callable[[Any], None]) -> Any:
    """Options or a recipe (a dict) with key ``old`` (a name kept for one release) read as ``new``: ``said(value)``
    once; both given and different: ``disagree(old value, new value)`` is raised."""
    if not isinstance(data, dict) or old not in data:
        return data
    data = dict(data)
    value = data.pop(old)
    if data.get(new, value) != value:
        raise disagree(value, data[new])
    data[new] = value
    said(value)
    return data


def flavour_from_backend(data: Any) -> Any:
    """``backend=`` (the TensorRT flavour's name until ``--trt``) read as ``flavour=``, with a DeprecationWarning."""
    import warnings

    return renamed(data, "backend", "flavour",
                   disagree=lambda old, new: UsageError(f"--backend {old} and --trt {new} disagree: give --trt only "
                                                        "(--backend is its old name)"),
                   said=lambda _: warnings.warn("backend= names the TensorRT flavour: it is flavour= now (--trt on the "
                                                "command line)", DeprecationWarning, stacklevel=5))


def coerce(cls: type[Options], request: Any, options: dict[str, Any], first: str) -> Options:
    """``request`` as ``cls``: a request as is (``options`` then refused), else ``cls(first=request,
    **options)``."""
    if isinstance(request, cls):
        if options:
            raise UsageError(f"pass a {cls.__name__} or options, not both (got {', '.join(sorted(options))})")
        return request
    if request is not None:
        options = {first: request, **options}
    return cls(**options)


def milliseconds(value: Any, what: str) -> Optional[float]:
    """``25``, ``25ms``, ``"25 ms"`` or ``0.025s`` -> 25.0 (milliseconds); None stays None."""
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value is None else float(value)
    text = str(value).strip().lower().replace(" ", "")
    scale = 1.0
    if text.endswith("ms"):
        text = text[:-2]
    elif text.endswith("s"):
        text, scale = text[:-1], 1000.0
    try:
        return float(text) * scale
    except ValueError as cause:
        raise UsageError(f"{what} {value!r}: expected milliseconds, e.g. 25 or 25ms") from cause


def _items(value: Any) -> list[str]:
    """A comma list (or a list of comma lists) -> its non-empty items."""
    if value is None:
        return []
    parts = value if isinstance(value, (list, tuple)) else [value]
    return [item.strip() for part in parts for item in str(part).split(",") if item.strip()]


def _positive_ints(value: Any, message: str) -> list[int]:
    """A comma list of positive whole numbers (``--batch 1,8``) -> sorted and de-duplicated; else a UsageError of
    ``message`` with the items given in its ``{}``."""
    items = _items(value)
    if not all(i.isdigit() and int(i) > 0 for i in items):
        raise UsageError(message.format(",".join(items)))
    return sorted({int(i) for i in items})


def _imgsz_into(data: Any, field: str, make) -> Any:
    """A request's ``imgsz`` (``--imgsz``) as its ``field`` (``make`` of the batch-1 shape ``1x3xHxW``); refused
    beside a ``field`` of its own."""
    if not isinstance(data, dict) or data.get("imgsz") is None:
        if isinstance(data, dict) and "imgsz" in data:
            data = {k: v for k, v in data.items() if k != "imgsz"}
        return data
    data = dict(data)
    imgsz = data.pop("imgsz")
    if data.get(field):
        flag = {"input": "--input", "profiles": "--profile"}[field]
        raise UsageError(f"--imgsz {imgsz} and {flag} both give the input size: give one ({flag} where batch matters)")
    h, w = image_size(str(imgsz), "--imgsz")
    data[field] = make(f"1x3x{h}x{w}")
    return data


def check_types(**arguments: tuple[Any, Any]) -> None:
    """Python API arguments against their types, as the CLI's parsing checks them: ``name=(value, type or types)``;
    ``bool`` is no ``int`` here and nothing else is a ``bool`` (``random_init="yes please"`` is refused, not true)."""
    for name, (value, types) in arguments.items():
        allowed = types if isinstance(types, tuple) else (types,)
        ok = any(value is None if t is None else (isinstance(value, t) and (t is bool or not isinstance(value, bool)))
                 for t in allowed)
        if not ok:
            words = " or ".join("None" if t is None else t.__name__ for t in allowed)
            raise UsageError(f"{name}={value!r}: expected {words}, not {type(value).__name__}")


def image_size(text: str, what: str = "--input") -> tuple[int, int]:
    """``320`` -> (320, 320); ``384x640`` -> (384, 640); for ``--input`` also ``1x3x384x640``. A size (``--imgsz``,
    ``imgsz``) is N or HxW only: a batch and channels are ``--input``'s, so ``2x1x320x320`` is refused rather than
    read as its last two numbers. A size whose one RGB image would not fit in memory is refused before any work."""
    text = str(text).strip()
    nchw = what in ("--input", "input")
    if not nchw and not re.fullmatch(r"\d+(x\d+)*", text):
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise UsageError(f"malformed {what} {shown!r}: expected a size (640) or HxW (384x640)")
    if not nchw and any(int(d) <= 0 for d in text.split("x") if len(d) <= 10):
        raise UsageError(f"{what} {text!r}: every side must be positive (a size like 640, or HxW like 384x640)")
    dims = tuple(parse_shape(f"{text}x{text}" if text.isdigit() else text, what=what))
    if len(dims) not in ((2, 4) if nchw else (2,)) or min(dims) < 1:
        also = " (NxCxHxW is --input's)" if len(dims) == 4 else ""
        raise UsageError(f"{what} {text!r}: expected a size (320) or HxW (384x640){also}")
    h, w = dims[-2], dims[-1]
    parse_shape(f"1x3x{h}x{w}", what=what)  # one float image of that size must fit in memory
    return h, w
