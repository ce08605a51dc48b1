"""What to do, as one validated object per verb: ExportRequest, BuildRequest, VerifyRequest.

Every option lives here once, with its validation. The CLI parses flags into a request, a
recipe produces requests, and the Python API takes a request or the same names as keywords::

    enginekit.build("yolo12n", precision="fp16", random_init=True)
    enginekit.build(BuildRequest(target="yolo12n", precision="fp16", random_init=True))

A bad value is a one-line ``UsageError`` naming the option (``--calib-count: ...``), raised
before any work. Checks that need the machine (GPU, TensorRT) stay with the flows.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from enginekit import precisions
from enginekit.compare.tolerances import Tolerances
from enginekit.errors import UsageError
from enginekit.backends import names
from enginekit.backends.registry import parse_backends
from enginekit.families import registered, resolve
from enginekit.families.registry import resolve_any
from enginekit.families.torch_models.sources import PROGRAM_SUFFIXES
from enginekit.families.torch_models.spec import ModelSpec
from enginekit.fsutil import check_output_path
from enginekit.model import ModelRequest, check_weights_choice
from enginekit.shapes import parse_shape
from enginekit.options import (BY_FIELD, CALIB_CACHE, CALIB_COUNT, CALIB_DATA, CALIB_METHOD, EXCLUDE, NMS, OPSET,
                               OPT_LEVEL, PROFILES, RANDOM_INIT, SEED, TARGET_CC, TRT, WEIGHTS, WORKSPACE, Option,
                               workspace_problem)
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
