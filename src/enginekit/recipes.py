"""Recipe files -> validated objects: which model, which shapes, precisions and targets to build.

A recipe is a YAML file (schema: ``Recipe`` below). Loading it validates everything a build
would refuse later, before any work starts, and names the file, line and key of the first
problem in one line::

    recipes/x.yaml:7: unknown key 'precisons' (did you mean precisions?)

Every ``enginekit build`` flag has a recipe key; flags given on the command line override the
file. Nothing here imports torch, onnx or tensorrt: validating a recipe is cheap.
"""

from __future__ import annotations

import difflib
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from enginekit import precisions as precision_registry
from enginekit.compare.tolerances import Limit, Tolerances
from enginekit.errors import UsageError

RECIPE_SUFFIXES = (".yaml", ".yml")
VERIFY_ONLY = ("images", "image_count", "require_engine", "task_required", "tolerances", "report_dir", "junit",
               "data", "data_limit", "data_split", "recheck", "allow_unverifiable")  # VerifyRequest names
DEFAULT_TARGETS = "default"  # a target set meaning: this GPU, else the backend's portable set
CALIBRATION_OPTIONS = ("calib_data", "calib_count", "calib_method", "calib_cache", "exclude")  # BuildRequest names

Loc = tuple[Union[str, int], ...]


# --- schema ----------------------------------------------------------------------------


class _Strict(BaseModel):
    """Unknown keys are refused (a typo must never be silently ignored)."""

    model_config = ConfigDict(extra="forbid")


class ModelSection(_Strict):
    """The ``model:`` key: which network, with which weights (``Recipe.model_request()``), and for a model
    enginekit cannot know by itself what it declares (``families.torch_models.spec``)."""

    # yolo12n, depth-anything-v2-small|base|large, depth, torchvision:NAME, timm:NAME, path/file.py:factory
    # (relative to the recipe file), package.module:factory, program.pt2
    variant: str
    family: Optional[str] = None  # yolo | depth-anything-v2 | pytorch: checked against the variant, filled in
    weights: Optional[str] = None  # local checkpoint, relative to the recipe file (--weights)
    random_init: bool = False  # seeded random weights, no download: CI and offline use (--random-init)
    seed: int = 0  # --seed
    opset: int = 18  # ONNX opset of the export (--opset)

    # what the model's outputs mean and how its inputs are made (--task, --outputs, ...); torchvision's and
    # timm's common heads come declared; checked as the flags are
    task: Optional[str] = None  # semantic | classify | depth | raw
    outputs: Optional[Union[str, list[str], dict[str, str]]] = None  # [out:logits, aux:logits] or {out: logits}
    size: Optional[Union[str, int]] = None  # 512x512
    dynamic: Optional[Union[str, list[str]]] = None  # batch,height,width | batch | none
    mean: Optional[Union[str, list[float]]] = None  # of 0..1 pixels, per channel
    std: Optional[Union[str, list[float]]] = None
    resize: Optional[str] = None  # stretch | letterbox | crop
    channels: Optional[str] = None  # rgb | bgr
    classes: Optional[int] = None  # torchvision/timm: build with this many classes

    @field_validator("opset")
    @classmethod
    def _opset(cls, opset: int) -> int:
        from enginekit.requests import OPSET_MAX, OPSET_MIN

        if not OPSET_MIN <= opset <= OPSET_MAX:
            raise _problem(("model", "opset"), f"opset {opset}: the exporter writes opsets {OPSET_MIN} to {OPSET_MAX}")
        return opset

    def declared(self) -> dict:
        """The declaration fields set here, validated (a UsageError names the flag)."""
        from enginekit.families.torch_models.spec import FLAGS, ModelSpec

        return ModelSpec.of({k: getattr(self, k) for k in FLAGS if getattr(self, k) is not None}).given()


class Calibration(_Strict):
    """INT8 post-training calibration (ignored by fp32 and fp16)."""

    # an image folder, a dataset YAML (its train split), a video (frames sampled evenly) or a .npy/.npz;
    # default: photographs in installed packages
    data: Optional[str] = None
    count: int = Field(8, gt=0)  # --calib-count
    method: Optional[str] = None  # --calib-method; None: the family's default
    cache: Optional[str] = None  # --calib-cache: read if it exists, else written
    exclude: list[str] = []  # --exclude: node-name regexes kept out of INT8 (on top of the family's)

    @field_validator("method")
    @classmethod
    def _known_method(cls, method: Optional[str]) -> Optional[str]:
        from enginekit.stages.int8 import CALIBRATION_METHODS

        if method is not None and method not in CALIBRATION_METHODS:
            raise _problem(("calibration", "method"),
                           f"unknown calibration method {method!r}: choose {', '.join(CALIBRATION_METHODS)}")
        return method

    @field_validator("exclude")
    @classmethod
    def _regexes(cls, patterns: list[str]) -> list[str]:
        for i, pattern in enumerate(patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise _problem(("calibration", "exclude", i), f"bad regex {pattern!r}: {exc}") from exc
        return patterns


class PartToleranceSpec(_Strict):
    """Parity limits of one output part (YOLO boxes or scores, depth)."""

    rel_l2: Optional[float] = None
    cosine: Optional[float] = None  # minimum cosine similarity
    max_abs: Optional[float] = None


class ToleranceSpec(_Strict):
    """Parity limits of one precision against the FP32 PyTorch reference.

    ``rel_l2``/``cosine`` apply to every output part; ``parts`` sets one part's own limits.
    Values are checked as ``--tol`` checks them (``compare.tolerances``).
    """

    rel_l2: Optional[float] = None
    cosine: Optional[float] = None  # minimum cosine similarity
    parts: dict[str, PartToleranceSpec] = {}  # per output part: {scores: {max_abs: 0.01}}
    task: dict[str, float] = {}  # task-metric limits (map50, recall, ... / abs_rel, delta1)
    labels: dict[str, float] = {}  # against verification.data's labels: {map50_95_drop: 0.01} (--tol gt.NAME)

    def limits(self, precision: str) -> list[tuple[Loc, Limit]]:
        """Each limit set here, with the key it is written at (below ``verification.tolerances.<precision>``)."""
        found = [((name,), Limit(name, value, precision)) for name, value in
                 (("rel_l2", self.rel_l2), ("cosine", self.cosine)) if value is not None]
        found += [(("task", metric), Limit(metric, value, precision)) for metric, value in self.task.items()]
        found += [(("labels", name), Limit(name, value, precision, "gt")) for name, value in self.labels.items()]
        for part, spec in self.parts.items():
            found += [(("parts", part, name), Limit(name, value, precision, part))
                      for name, value in spec.model_dump().items() if value is not None]
        return found


class Verification(_Strict):
    """How built engines are checked."""

    images: Optional[str] = None  # photographs to verify on (verify --images); default: packaged ones
    image_count: Optional[int] = Field(None, gt=0)  # verify --image-count (None: verify's default)
    # a labelled dataset (an Ultralytics dataset YAML or a folder with YOLO labels): every precision scored
    # against its labels (verify --data), its split (--data-split) and how many images (--data-limit)
    data: Optional[str] = None
    data_split: Optional[str] = None  # None: val
    data_limit: Optional[int] = Field(None, gt=0)
    on_build: bool = True  # record a parity check in the manifest at build time (build --no-verify)
    require_engine: bool = False  # fail when the engine cannot run here (verify --require-engine)
    # False: where the reference has nothing to compare (a random-weight detector finds nothing at
    # the operating point) the report says so instead of failing (verify --task-optional)
    task_required: bool = True
    tolerances: dict[str, ToleranceSpec] = {}  # per precision; missing values take the family's defaults

    @field_validator("tolerances")
    @classmethod
    def _limits(cls, tolerances: dict[str, ToleranceSpec]) -> dict[str, ToleranceSpec]:
        for precision, spec in tolerances.items():
            at = ("verification", "tolerances", precision)
            if precision not in precision_registry.PRECISIONS:
                raise _problem(at, f"unknown precision {precision!r}: choose {', '.join(precision_registry.NAMES)}")
            for loc, limit in spec.limits(precision):
                problem = limit.problem([limit.name])  # its value: the family checks its name (_check_verification)
                if problem:
                    raise _problem(at + loc, problem)
        return tolerances

    @model_validator(mode="after")
    def _data_options(self) -> "Verification":
        for key in ("data_split", "data_limit"):
            if getattr(self, key) is not None and self.data is None:
                raise _problem(("verification", key), f"{key} chooses what verification.data scores, and no data is given")
        return self


class Builder(_Strict):
    """TensorRT builder options."""

    workspace: Optional[str] = None  # --workspace, e.g. 4G
    opt_level: Optional[int] = Field(None, ge=0, le=5)  # --opt-level
    # --repair: an fp16/int8 graph that fails parity keeps its fewest offending nodes in FP32
    # (gated by verification.tolerances)
    repair: bool = False

    @field_validator("workspace")
    @classmethod
    def _size(cls, workspace: Optional[str]) -> Optional[str]:
        from enginekit.requests import workspace_bytes

        if workspace is not None:
            try:
                workspace_bytes(workspace, "workspace")
            except UsageError as exc:
                raise _problem(("builder", "workspace"), str(exc)) from exc
        return workspace


class RuntimeSection(_Strict):
    """How to run what the recipe builds (``enginekit tune`` writes it): the runtime backend, the network's
    input, frames per inference call and per step, the model's cadence. ``build`` and ``verify`` do not read
    it; ``enginekit.load(RECIPE)`` and ``predict RECIPE`` take its backend and input when not given."""

    backend: str = "auto"  # a runtime backend: auto, tensorrt, onnxruntime-cuda, onnxruntime-cpu, torch
    input: Optional[str] = None  # the network's H x W (384x640); None: the family's (or the profile's)
    batch: int = Field(1, gt=0)  # frames per inference call
    frames_per_step: int = Field(1, gt=0)  # frames of one step (stereo: 2), batched
    every: int = Field(1, gt=0)  # runs on every N-th step

    @field_validator("backend")
    @classmethod
    def _backend(cls, backend: str) -> str:
        from enginekit.backends import choices

        if backend not in choices():
            raise _problem(("runtime", "backend"), f"unknown backend {backend!r}: choose {', '.join(choices())}")
        return backend

    @field_validator("input")
    @classmethod
    def _input(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            from enginekit.requests import image_size

            try:
                h, w = image_size(value, "input")
            except UsageError as exc:
                raise _problem(("runtime", "input"), str(exc)) from exc
            return f"{h}x{w}"
        return value

    def input_size(self) -> Optional[tuple[int, int]]:
        if self.input is None:
            return None
        h, _, w = self.input.partition("x")
        return int(h), int(w)


class Recipe(_Strict):
    """One model configuration: every (precision, target set) of it is one engine."""

    description: str = ""
    model: ModelSection
    input: Optional[str] = None  # the model's input tensor; filled in (and checked) from the family
    # One TensorRT optimization profile each (--profile): NxCxHxW or min:opt:max.
    profiles: list[str] = []
    precisions: list[str] = ["fp32"]  # --precision
    calibration: Calibration = Calibration()
    verification: Verification = Verification()
    trt: Literal["auto", "tensorrt", "tensorrt-rtx"] = "auto"  # --trt: the TensorRT that builds (``backend:`` until now)
    # One engine (and one CI job) per entry: "8.6,8.9,12.0" is ONE engine that runs on all three.
    targets: list[str] = [DEFAULT_TARGETS]  # --target-cc
    builder: Builder = Builder()
    runtime: Optional[RuntimeSection] = None  # how to run it (enginekit tune); build ignores it

    _path: Path = PrivateAttr(default=Path("recipe.yaml"))

    @model_validator(mode="before")
    @classmethod
    def _backend_is_trt(cls, data: Any) -> Any:
        """``backend:`` (the TensorRT that builds, until it was named ``trt:``) is read as ``trt:``, said once."""
        from enginekit import reporting
        from enginekit.requests import renamed

        return renamed(data, "backend", "trt",
                       disagree=lambda old, new: _problem(("backend",), f"backend: {old} and trt: {new} disagree: keep "
                                                                        "trt: only (backend: is its old name)"),
                       said=lambda old: reporting.warning(f"recipe key backend: names the TensorRT that builds: it is "
                                                          f"trt: now (trt: {old}); backend: goes in a later release"))

    @field_validator("profiles", "precisions", "targets", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any, info: ValidationInfo) -> Any:
        """A single value stands for a list of one (``precisions: fp16``). YAML reads a target
        8.6 as a number and [8.6, 8.9] as a list: both stand for a target set, as text."""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if info.field_name == "targets" and isinstance(value, list):
            value = [_target_text(item) for item in value]
        return value

    @field_validator("precisions")
    @classmethod
    def _precision_list(cls, precisions: list[str]) -> list[str]:
        if not precisions:
            raise _problem(("precisions",), f"names no precision: choose from {', '.join(precision_registry.NAMES)}")
        for i, precision in enumerate(precisions):
            try:
                precision_registry.get(precision)
            except UsageError as exc:
                raise _problem(("precisions", i), str(exc)) from exc
            if precision in precisions[:i]:
                raise _problem(("precisions", i), f"{precision} is listed twice")
        return precisions

    @model_validator(mode="after")
    def _buildable(self, info: ValidationInfo) -> "Recipe":
        """What a build would refuse later (model, shapes, targets, files), checked now.

        Paths in the recipe are relative to its file: ``model_validate(data, context={"path": p})``.
        """
        if info.context and info.context.get("path") is not None:
            self._path = Path(info.context["path"])
        try:
            _check(self)
        except _Problem as problem:
            raise _problem(problem.loc, problem.message) from problem
        return self

    # -- identity ---------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def name(self) -> str:
        return self._path.stem

    def adapter(self):
        from enginekit.families import resolve

        return resolve(self.variant, self.model.declared())

    @property
    def variant(self) -> str:
        """The model's name; a ``file.py:factory`` or program path relative to the recipe's folder."""
        from enginekit.families.torch_models.sources import looks_like, parse

        v = self.model.variant
        if looks_like(v) and parse(v).kind in ("file", "export", "torchscript"):
            path, sep, factory = v.rpartition(":") if parse(v).kind == "file" else (v, "", "")
            return f"{self._file(path)}{sep}{factory}"
        return v

    def model_request(self):
        """The model this recipe builds (``enginekit.model.ModelRequest``; its weights relative to the file)."""
        from enginekit.model import ModelRequest

        m = self.model
        return ModelRequest(self.variant, self._file(m.weights), m.random_init, m.seed, declared=m.declared())

    # -- what to build ----------------------------------------------------------------
    def target_sets(self) -> list[Optional[tuple[str, ...]]]:
        """Each ``targets`` entry as sorted compute capabilities; None: the default set."""
        return [parse_target_set(text) for text in self.targets]

    def cells(self, overrides: Optional[dict] = None) -> list["Cell"]:
        """One job per (precision, target set); ``--precision``/``--target-cc`` narrow it to theirs."""
        overrides = overrides or {}
        precisions = [overrides["precision"]] if overrides.get("precision") else self.precisions
        if overrides.get("target_cc") is not None:
            target_sets = [parse_target_set(overrides["target_cc"])]
        else:
            target_sets = self.target_sets()
        return [Cell(p, t) for p in precisions for t in target_sets]

    def build_request(self, cell: Union["Cell", str], overrides: Optional[dict] = None):
        """The ``BuildRequest`` of one cell; ``overrides`` (BuildRequest names, from command-line
        flags) win over the file.

        All profiles of the recipe go into ONE engine per cell, as several optimization
        profiles: that is what repeating ``--profile`` does on the command line, a deployment
        ships one plan per precision and picks the profile by input size, and the export and
        calibration are shared anyway. A profile that needs its own plan gets its own recipe.
        """
        from enginekit.requests import BuildRequest

        return BuildRequest(**self._build_options(cell, overrides))

    def _build_options(self, cell: Union["Cell", str], overrides: Optional[dict] = None) -> dict:
        if isinstance(cell, str):
            cell = Cell(cell, self.cells(overrides)[0].targets)
        m, c = self.model, self.calibration
        options = {
            "target": self.variant,
            "declared": m.declared(),
            "profiles": list(self.profiles),
            "precision": cell.precision,
            "flavour": self.trt,
            "target_cc": cell.target_cc,
            "workspace": self.builder.workspace,
            "opt_level": self.builder.opt_level,
            "calib_data": self._file(c.data),
            "calib_count": c.count,
            "calib_method": c.method,
            "calib_cache": self._file(c.cache),
            "exclude": list(c.exclude),
            "weights": self._file(m.weights),
            "random_init": m.random_init,
            "seed": m.seed,
            "opset": m.opset,
            "verify": self.verification.on_build,
        }
        if self.builder.repair:  # passed only when asked for, like the flag
            options.update(repair=True, tolerances=self.tolerances())
        extra = {k: v for k, v in (overrides or {}).items() if k not in ("precision", "target_cc")}
        if extra.get("tolerances"):  # --tol adds to the recipe's tolerances (later ones win)
            extra["tolerances"] = self.tolerances() + _given_tolerances(extra["tolerances"])
        if extra.get("weights") is not None:  # real weights on the command line beat random init
            options["random_init"] = False
        if extra.get("random_init"):
            options["weights"] = None
        if extra.get("declared"):  # --task, --outputs... over the recipe's declaration
            extra["declared"] = {**options["declared"], **extra["declared"]}
        options.update(extra)
        if not precision_registry.get(cell.precision).calibrated:
            # the recipe's calibration (and a --calib-* flag given with it) is for its calibrated cells
            for name in CALIBRATION_OPTIONS:
                options.pop(name, None)
        return options

    # -- how to verify ----------------------------------------------------------------
    def tolerances(self) -> Tolerances:
        """The recipe's own tolerances (``verification.tolerances``), as ``--tol`` would give them."""
        return Tolerances(tuple(limit for precision, spec in self.verification.tolerances.items()
                                for _, limit in spec.limits(precision)))

    def gates(self):
        """The family's gates with the recipe's tolerances (``compare.comparison.Gates``)."""
        from enginekit.compare.comparison import Gates

        return Gates(self.adapter(), self.tolerances())

    def tolerance(self, precision: str):
        """The parity limits of ``precision``: the recipe's, else the family's defaults."""
        return self.gates().parity(precision)

    def task_gates(self, precision: str) -> dict[str, tuple[str, float]]:
        """Task metric -> (">=" or "<=", limit): the family's gates with the recipe's limits."""
        return self.gates().task(precision)

    def images(self) -> Optional[Path]:
        return self._file(self.verification.images)

    def verify_request(self, cell: Union["Cell", str], overrides: Optional[dict] = None):
        """The ``VerifyRequest`` of one cell: the engine that ``build_request`` makes, checked on
        the recipe's images against its tolerances.

        ``overrides`` holds BuildRequest and VerifyRequest names; verify's ``tolerances``
        (``--tol``) come after the recipe's, so they win.
        """
        from enginekit.requests import BuildRequest, VerifyRequest

        overrides = dict(overrides or {})
        given = {k: overrides.pop(k) for k in VERIFY_ONLY if k in overrides}
        build = self._build_options(cell, overrides)
        for run_option in ("force", "explain"):
            build.pop(run_option, None)
        options = {"target": build["target"], "precision": build["precision"], "images": self.images(),
                   "image_count": self.verification.image_count, "data": self._file(self.verification.data),
                   "data_split": self.verification.data_split, "data_limit": self.verification.data_limit,
                   "require_engine": self.verification.require_engine,
                   "task_required": self.verification.task_required,
                   "tolerances": self.tolerances() + _given_tolerances(given.pop("tolerances", None)),
                   "build": BuildRequest(**build)}
        options.update(given)
        return VerifyRequest(**options)

    # -- rendering --------------------------------------------------------------------
    def resolved(self) -> dict:
        """The recipe with every default filled in; itself a valid recipe."""
        adapter = self.adapter()
        data = self.model_dump(mode="json")
        data["model"]["family"] = adapter.family
        data["input"] = adapter.input_name
        if not data["profiles"]:
            from enginekit.shapes import format_shape

            data["profiles"] = [format_shape(adapter.default_input)]
        data["targets"] = [",".join(t) if t else DEFAULT_TARGETS for t in self.target_sets()]
        precisions = list(self.precisions) + [p for p in self.verification.tolerances if p not in self.precisions]
        data["verification"]["tolerances"] = {p: self._tolerance_dict(p) for p in precisions}
        return data

    def _tolerance_dict(self, precision: str) -> dict:
        """Every limit in force: per output part (the family's measured defaults, then the
        recipe's), and the task gates."""
        adapter = self.adapter()
        gates = self.gates()
        parts = {}
        for part in adapter.known_parts():
            tol = gates.parity(precision, part)
            parts[part] = {k: v for k, v in tol.to_json().items() if v is not None}
        return {"parts": parts, "task": {k: v[1] for k, v in gates.task(precision).items()}}

    def _file(self, value: Optional[str]) -> Optional[Path]:
        """A path written in the recipe is relative to the recipe's folder."""
        if value is None:
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() else self._path.parent / path


def _given_tolerances(value: Any) -> Tolerances:
    """``--tol`` items given with a recipe (or a Tolerances), checked as a request checks them."""
    from enginekit.requests import tolerances

    return tolerances(value)


@dataclass(frozen=True)
class Cell:
    """One engine of a recipe: a precision and a target set (None: the default set)."""

    precision: str
    targets: Optional[tuple[str, ...]]

    @property
    def target_cc(self) -> Optional[str]:
        """The ``--target-cc`` value of this cell (None: the backend's default)."""
        return ",".join(self.targets) if self.targets else None

    @property
    def targets_label(self) -> str:
        return self.target_cc or DEFAULT_TARGETS


def _target_text(item: Any) -> Any:
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        return str(item)
    if isinstance(item, list):
        return ",".join(str(x) for x in item)
    return item


def parse_target_set(text: str) -> Optional[tuple[str, ...]]:
    """``"8.9,8.6"`` -> ``("8.6", "8.9")``; ``"default"`` (or empty) -> None."""
    from enginekit.trt.flavours import cc_tuple, normalize_cc

    text = str(text).strip()
    if text in ("", DEFAULT_TARGETS):
        return None
    items = {normalize_cc(item) for item in text.split(",") if item.strip()}
    return tuple(sorted(items, key=cc_tuple))


# --- loading YAML with line numbers -----------------------------------------------------


def _compose(text: str, file: str) -> tuple[Any, dict[Loc, int]]:
    """Parse YAML into Python values and a map from each key path to its line (1-based)."""
    if len(text) > MAX_RECIPE_CHARS:
        raise UsageError(f"{file}: {len(text)} characters; a recipe is at most {MAX_RECIPE_CHARS}")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_depth(node, file)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise UsageError(f"{file}:{line}: malformed YAML: {exc.problem or exc.context}") from exc
    except RecursionError as cause:  # the parser itself recurses per level: `[[[[...` ends here
        raise UsageError(f"{file}: nested too deeply (a recipe nests at most {MAX_RECIPE_DEPTH} levels)") from cause
    finally:
        loader.dispose()
    lines: dict[Loc, int] = {(): 1}
    if node is not None:
        _record_lines(node, (), lines, file)
    return data, lines


# A recipe is a few keys a few levels deep; anything far beyond is not a recipe.
MAX_RECIPE_CHARS = 1 << 20
MAX_RECIPE_DEPTH = 32
# Values once YAML aliases are expanded: a shipped recipe has about 60. Aliases let a few hundred
# bytes stand for billions of values (9 anchors of 9 aliases each: 9**9), which every later walk
# of the document (line numbers, validation) would expand.
MAX_RECIPE_VALUES = 10_000


def _check_depth(root: yaml.Node, file: str) -> None:
    """Refuse a document nested deeper than MAX_RECIPE_DEPTH, or holding more than
    MAX_RECIPE_VALUES values with its aliases expanded (iteratively: no recursion; the count
    stops the walk, so an alias bomb is refused in bounded time)."""
    stack = [(root, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_RECIPE_VALUES:
            raise UsageError(f"{file}: more than {MAX_RECIPE_VALUES} values once its aliases (*name) are expanded; "
                             "a recipe is a few dozen keys")
        if depth > MAX_RECIPE_DEPTH:
            raise UsageError(f"{file}:{node.start_mark.line + 1}: nested deeper than {MAX_RECIPE_DEPTH} levels")
        if isinstance(node, yaml.MappingNode):
            stack.extend((v, depth + 1) for _, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, depth + 1) for v in node.value)


def _record_lines(node: yaml.Node, path: Loc, lines: dict[Loc, int], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = path + (key_node.value,)
            if key in lines:  # YAML keeps the last of two equal keys: almost always a mistake
                raise UsageError(f"{file}:{key_node.start_mark.line + 1}: key '{_dotted(key)}' is given twice")
            lines[key] = key_node.start_mark.line + 1
            _record_lines(value_node, key, lines, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _record_lines(item, path + (i,), lines, file)


def _line_of(loc: Loc, lines: dict[Loc, int]) -> int:
    """The line of ``loc``, else of its nearest enclosing key."""
    for n in range(len(loc), -1, -1):
        if tuple(loc[:n]) in lines:
            return lines[tuple(loc[:n])]
    return 1


def _dotted(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


# --- error messages ---------------------------------------------------------------------


def _schema_levels(model: type[BaseModel] = Recipe, path: Loc = ()) -> dict[Loc, list[str]]:
    """Each mapping level of the schema ('*' for free keys) -> the keys it accepts."""
    levels = {path: list(model.model_fields)}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            annotation, sub = typing.get_args(annotation)[1], path + (name, "*")
        else:
            sub = path + (name,)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            levels.update(_schema_levels(annotation, sub))
    return levels


def _level_matches(pattern: Loc, loc: Loc) -> bool:
    return len(pattern) == len(loc) and all(p == "*" or p == x for p, x in zip(pattern, loc))


def _suggest(loc: Loc) -> Optional[str]:
    """A known key close to the unknown one at ``loc``: same level first, then anywhere."""
    parent, key = tuple(loc[:-1]), str(loc[-1])
    levels = _schema_levels()
    for pattern, keys in levels.items():
        if _level_matches(pattern, parent):
            close = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
            if close:
                return _dotted(parent + (close[0],))
    anywhere = {name: pattern + (name,) for pattern, keys in levels.items() for name in keys if "*" not in pattern}
    close = difflib.get_close_matches(key, list(anywhere), n=1, cutoff=0.75)
    return _dotted(anywhere[close[0]]) if close else None


def _error_loc(error: dict) -> Loc:
    """Where an error points: a check's own key, else pydantic's location."""
    if error["type"] == _CHECK:
        return tuple(error["ctx"]["at"])
    return tuple(error["loc"])


def _describe(error: dict) -> str:
    """One pydantic error -> 'key: what is wrong', in the recipe's words."""
    loc = tuple(p for p in _error_loc(error) if p != "[key]")
    kind = error["type"]
    if kind == _CHECK:
        return f"{_dotted(loc)}: {error['ctx']['message']}"
    if kind == "extra_forbidden":
        hint = _suggest(loc)
        return f"unknown key '{_dotted(loc)}'" + (f" (did you mean {hint}?)" if hint else "")
    if kind == "missing":
        return f"missing key '{_dotted(loc)}'"
    message = error["msg"][0].lower() + error["msg"][1:]
    if kind.startswith(("literal_error", "enum")) or "[key]" in error["loc"]:
        message += f" (got {error['input']!r})"
    return f"{_dotted(loc)}: {message}"


def _validation_error(exc: ValidationError, file: str, lines: dict[Loc, int]) -> UsageError:
    """The first problem in file order, as one line naming file, line and key. Unknown keys
    come first: a typo'd key also makes its intended key look missing."""
    # Schema errors before checks: a check may only be failing because of a schema error elsewhere.
    errors = sorted(exc.errors(), key=lambda e: (e["type"] != "extra_forbidden", e["type"] == _CHECK,
                                                  _line_of(_error_loc(e), lines)))
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return UsageError(f"{file}:{_line_of(_error_loc(first), lines)}: {_describe(first)}{more}")


# --- checks a schema cannot express -----------------------------------------------------


class _Problem(Exception):
    def __init__(self, loc: Loc, message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message


_CHECK = "recipe_check"  # the pydantic error type of the checks above and in the schema's validators


def _problem(loc: Loc, message: str) -> PydanticCustomError:
    """A validator's error that names its own key: pydantic gives a field validator's error the
    field's location, but a check may point into it (``precisions[1]``) or at another key."""
    return PydanticCustomError(_CHECK, "{message}", {"message": message, "at": loc})


def _check(recipe: Recipe) -> None:
    """Everything a build would refuse later: model, shapes, targets, files, tolerances."""
    adapter = _check_model(recipe)
    _check_profiles(recipe, adapter)
    _check_calibration(recipe)
    _check_targets(recipe)
    _check_verification(recipe, adapter)
    _check_runtime(recipe, adapter)


def _check_runtime(recipe: Recipe, adapter) -> None:
    """``runtime.input`` is an input the model takes (a YOLO's sides are multiples of its stride)."""
    size = recipe.runtime.input_size() if recipe.runtime is not None else None
    if size is not None:
        shape = (1, int(adapter.default_input[1]), *size)
        _expect(("runtime", "input"), lambda: adapter.constraint.check(shape, what="size"))


def _expect(loc: Loc, fn, *args):
    """Run a check from elsewhere in enginekit; its UsageError becomes a problem at ``loc``."""
    try:
        return fn(*args)
    except UsageError as exc:
        raise _Problem(loc, str(exc)) from exc


def _check_model(recipe: Recipe):
    from enginekit.families import resolve

    m = recipe.model
    from enginekit.families.torch_models.spec import FLAGS, ModelSpec

    for key in FLAGS:  # each declaration key on its own line first
        if getattr(m, key) is not None:
            _expect(("model", key), ModelSpec.of, {key: getattr(m, key)})
    declared = _expect(("model",), m.declared)
    adapter = _expect(("model", "variant"), resolve, recipe.variant, declared)
    if m.family is not None and m.family != adapter.family:
        raise _Problem(("model", "family"), f"{m.variant} is a {adapter.family} model, not {m.family}")
    from enginekit.model import check_weights_choice

    _expect(("model", "weights"), lambda: check_weights_choice(m.weights, m.random_init,
                                                               names=("weights", "random_init: true")))
    _expect(("model", "weights"), recipe.model_request)  # the weights file exists
    if recipe.input is not None and recipe.input != adapter.input_name:
        raise _Problem(("input",), f"{adapter.variant}'s input is '{adapter.input_name}', not '{recipe.input}'")
    return adapter


def _check_profiles(recipe: Recipe, adapter) -> None:
    from enginekit.shapes import bind_to_model, parse_profile

    parsed = []
    for i, text in enumerate(recipe.profiles):
        profile = _expect(("profiles", i), parse_profile, text)
        bound = _expect(("profiles", i), profile.bind, [adapter.input_name])
        rng = bound.inputs[adapter.input_name]
        _expect(("profiles", i), lambda: adapter.constraint.check_range(rng, what="profile"))
        parsed.append(profile)
    _expect(("profiles",), bind_to_model, parsed, adapter)  # e.g. one H x W for YOLO


def _check_calibration(recipe: Recipe) -> None:
    c = recipe.calibration
    if c.data is not None and not recipe._file(c.data).exists():
        raise _Problem(("calibration", "data"), f"calibration data not found: {recipe._file(c.data)}")


def _check_targets(recipe: Recipe) -> None:
    from enginekit.trt.flavours import TRAITS

    rtx = TRAITS["tensorrt-rtx"]
    if not recipe.targets:
        raise _Problem(("targets",), f"names no target set: write '{DEFAULT_TARGETS}' or like 8.6,8.9,12.0")
    seen = []
    for i, text in enumerate(recipe.targets):
        targets = _expect(("targets", i), parse_target_set, text)
        if targets in seen:
            raise _Problem(("targets", i), f"target set {text} is listed twice")
        seen.append(targets)
        if targets is None:
            continue
        if recipe.trt != "tensorrt-rtx":
            raise _Problem(("targets", i), f"compute capability targets ({text}) need trt: tensorrt-rtx; "
                                           f"TensorRT builds only for the GPU it runs on ('{DEFAULT_TARGETS}')")
        unsupported = [t for t in targets if t not in rtx.compute_capabilities]
        if unsupported:
            raise _Problem(("targets", i), f"{rtx.label} cannot target compute capability "
                                           f"{', '.join(unsupported)}; supported: {', '.join(rtx.compute_capabilities)}")
    if "fp8" in recipe.precisions:
        from enginekit.trt.flavours import require_fp8

        for i, text in enumerate(recipe.targets):
            try:
                require_fp8(parse_target_set(text), subject="precision fp8", no_targets="the default targets",
                            fix="write targets like '8.9,12.0'")
            except UsageError as exc:
                raise _Problem(("targets", i), str(exc)) from exc


def _check_verification(recipe: Recipe, adapter) -> None:
    v = recipe.verification
    if v.images is not None and not recipe._file(v.images).exists():
        raise _Problem(("verification", "images"), f"images not found: {recipe._file(v.images)}")
    if v.data is not None and not recipe._file(v.data).exists():
        raise _Problem(("verification", "data"), f"dataset not found: {recipe._file(v.data)}")
    gates = getattr(adapter, "task_gates", {})
    known = sorted({metric for per_precision in gates.values() for metric in per_precision})
    for precision, spec in v.tolerances.items():
        for metric in spec.task:
            if metric not in known:
                raise _Problem(("verification", "tolerances", precision, "task", metric),
                               f"unknown task metric {metric!r} for {adapter.family}: "
                               f"choose {', '.join(known) or 'none (no task gates)'}")
    _expect(("verification", "tolerances"), recipe.gates)  # every part named is one of the family's


# --- finding and loading recipes --------------------------------------------------------


@dataclass(frozen=True)
class RecipeRef:
    """A recipe file found on disk: shipped with enginekit, or local to the working directory."""

    name: str
    path: Path
    origin: str  # "shipped" | "local"


SHIPPED_PACKAGE_DIR = "shipped_recipes"  # package data of enginekit (pyproject's package-data)


def shipped_dir() -> Path:
    """The recipes installed with enginekit (``enginekit/shipped_recipes``), wheel or checkout alike.

    The checkout's top-level ``recipes/`` is a link to this folder, so ``recipes/yolo12n.yaml``
    names the same file in the Makefile, CI examples and error messages.
    """
    from importlib.resources import files

    return Path(str(files("enginekit").joinpath(SHIPPED_PACKAGE_DIR)))


def local_dir() -> Path:
    return Path.cwd() / "recipes"


def recipe_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in RECIPE_SUFFIXES and p.is_file())


def list_recipes() -> list[RecipeRef]:
    """Local recipes first, then shipped ones; a local recipe replaces the shipped one of its name
    (listed once, built once)."""
    refs: list[RecipeRef] = []
    seen: set[Path] = set()
    names: set[str] = set()
    for origin, folder in (("local", local_dir()), ("shipped", shipped_dir())):
        if folder.resolve() == shipped_dir().resolve():
            origin = "shipped"  # run from the checkout itself
        for path in recipe_files(folder):
            if path.resolve() not in seen and path.stem not in names:
                seen.add(path.resolve())
                names.add(path.stem)
                refs.append(RecipeRef(path.stem, path, origin))
    return refs


def find_recipe(name_or_path: str) -> Path:
    """A recipe file: a path as given, else a recipe name (local before shipped)."""
    path = Path(name_or_path)
    if path.suffix in RECIPE_SUFFIXES or path.exists():
        from enginekit.fsutil import refuse_special_file

        refuse_special_file(path, "recipe")
        if not path.is_file():
            raise UsageError(f"recipe {path} is a folder, not a file" if path.is_dir() else f"recipe file not found: {path}")
        return path
    for ref in list_recipes():
        if ref.name == name_or_path:
            return ref.path
    known = ", ".join(sorted({r.name for r in list_recipes()})) or "none"
    raise UsageError(f"unknown recipe {name_or_path!r}: give a .yaml path or one of: {known}")


def display_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it (as CI jobs need)."""
    import os

    cwd = Path.cwd()
    # Links are kept as given first: recipes/ in the checkout links to the package's folder.
    for absolute, base in ((Path(os.path.abspath(path)), Path(os.path.abspath(cwd))), (Path(path).resolve(), cwd.resolve())):
        try:
            return absolute.relative_to(base).as_posix()
        except ValueError:
            continue
    return str(path)


def load_recipe(name_or_path: Union[str, Path]) -> Recipe:
    """Read and fully validate a recipe; any problem is one UsageError naming file, line and key."""
    path = find_recipe(str(name_or_path))
    file = str(name_or_path) if Path(str(name_or_path)).suffix in RECIPE_SUFFIXES else display_path(path)
    try:
        from enginekit.fsutil import read_text

        text = read_text(path, limit=4 * MAX_RECIPE_CHARS, what="recipe")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read recipe {file}: {exc}") from exc
    data, lines = _compose(text, file)
    if not isinstance(data, dict):
        raise UsageError(f"{file}:1: a recipe is a mapping of keys (model, profiles, precisions, ...)")
    try:
        return Recipe.model_validate(data, context={"path": path})
    except ValidationError as exc:
        raise _validation_error(exc, file, lines) from exc


def collect_recipe_files(paths: list[str]) -> list[Path]:
    """Files and folders (their *.yaml) and names -> recipe files; none given: every known recipe."""
    if not paths:
        return [ref.path for ref in list_recipes()]
    files: list[Path] = []
    for item in paths:
        if Path(item).is_dir():
            found = recipe_files(Path(item))
            if not found:
                raise UsageError(f"{item} holds no recipe (*.yaml)")
            files.extend(found)
        else:
            files.append(find_recipe(item))
    unique: list[Path] = []
    for path in files:  # a file named twice (a folder and a file in it): once
        if all(path.resolve() != other.resolve() for other in unique):
            unique.append(path)
    by_name: dict[str, Path] = {}
    for path in unique:
        if path.stem in by_name:  # two recipes of one name would be two CI jobs of one name
            raise UsageError(f"two recipes are named {path.stem}: {display_path(by_name[path.stem])} and "
                             f"{display_path(path)}; a recipe's name is its file's, and names one job")
        by_name[path.stem] = path
    return unique
