"""The recipe schema: one pydantic model per section (``Recipe`` the whole); what each cell of it builds and verifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from enginekit import precisions as precision_registry
from enginekit import reporting
from enginekit.backends import choices
from enginekit.compare.comparison import Gates
from enginekit.compare.tolerances import Limit, Tolerances
from enginekit.errors import UsageError
from enginekit.families import resolve
from enginekit.families.torch_models.sources import looks_like, parse
from enginekit.families.torch_models.spec import FLAGS, ModelSpec
from enginekit.model import ModelRequest
from enginekit.recipes.checks import _check
from enginekit.recipes.basics import DEFAULT_TARGETS, Loc, _Problem, _problem, _target_text, parse_target_set
from enginekit.options import (CALIB_CACHE, CALIB_COUNT, CALIB_DATA, CALIB_METHOD, ENGINE, EXCLUDE, OPSET, OPT_LEVEL,
                               PROFILES, RANDOM_INIT, SEED, TRT, WEIGHTS, WORKSPACE, MODEL, Option)
from enginekit.requests import BuildRequest, VerifyRequest, image_size, renamed, tolerances, typed
from enginekit.shapes import format_shape


RECIPE_SUFFIXES = (".yaml", ".yml")


VERIFY_ONLY = ("images", "image_count", "require_engine", "task_required", "tolerances", "report_dir", "junit",
               "data", "data_limit", "data_split", "recheck", "allow_unverifiable")  # VerifyRequest names


HELD = tuple(option for option in (*MODEL, OPSET, PROFILES, *ENGINE) if option.recipe)  # options a recipe key holds
CALIBRATION_OPTIONS = tuple(o.field for o in ENGINE if o.recipe and o.recipe[0] == "calibration")  # BuildRequest names


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
    weights: typed(WEIGHTS, as_text=True)  # local checkpoint, relative to the recipe file (--weights)
    random_init: typed(RANDOM_INIT)  # seeded random weights, no download: CI and offline use (--random-init)
    seed: typed(SEED)  # --seed
    opset: typed(OPSET)  # ONNX opset of the export (--opset)

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

    def declared(self) -> dict:
        """The declaration fields set here, validated (a UsageError names the flag)."""
        return ModelSpec.of({k: getattr(self, k) for k in FLAGS if getattr(self, k) is not None}).given()


class Calibration(_Strict):
    """INT8 post-training calibration (ignored by fp32 and fp16)."""

    # an image folder, a dataset YAML (its train split), a video (frames sampled evenly) or a .npy/.npz;
    # default: photographs in installed packages
    data: typed(CALIB_DATA, as_text=True)
    count: typed(CALIB_COUNT)  # --calib-count
    method: typed(CALIB_METHOD)  # --calib-method; None: the family's default
    cache: typed(CALIB_CACHE, as_text=True)  # --calib-cache: read if it exists, else written
    exclude: typed(EXCLUDE)  # --exclude: node-name regexes kept out of INT8 (on top of the family's)


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

    workspace: typed(WORKSPACE)  # --workspace, e.g. 4G
    opt_level: typed(OPT_LEVEL)  # --opt-level
    # --repair: an fp16/int8 graph that fails parity keeps its fewest offending nodes in FP32
    # (gated by verification.tolerances)
    repair: bool = False


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
        if backend not in choices():
            raise _problem(("runtime", "backend"), f"unknown backend {backend!r}: choose {', '.join(choices())}")
        return backend

    @field_validator("input")
    @classmethod
    def _input(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
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
    profiles: typed(PROFILES)
    precisions: list[str] = ["fp32"]  # --precision
    calibration: Calibration = Calibration()
    verification: Verification = Verification()
    trt: typed(TRT)  # --trt: the TensorRT that builds (``backend:`` until now)
    # One engine (and one CI job) per entry: "8.6,8.9,12.0" is ONE engine that runs on all three.
    targets: list[str] = [DEFAULT_TARGETS]  # --target-cc
    builder: Builder = Builder()
    runtime: Optional[RuntimeSection] = None  # how to run it (enginekit tune); build ignores it

    _path: Path = PrivateAttr(default=Path("recipe.yaml"))

    @model_validator(mode="before")
    @classmethod
    def _backend_is_trt(cls, data: Any) -> Any:
        """``backend:`` (the TensorRT that builds, until it was named ``trt:``) is read as ``trt:``, said once."""
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
        return resolve(self.variant, self.model.declared())

    @property
    def variant(self) -> str:
        """The model's name; a ``file.py:factory`` or program path relative to the recipe's folder."""
        v = self.model.variant
        if looks_like(v) and parse(v).kind in ("file", "export", "torchscript"):
            path, sep, factory = v.rpartition(":") if parse(v).kind == "file" else (v, "", "")
            return f"{self._file(path)}{sep}{factory}"
        return v

    def model_request(self):
        """The model this recipe builds (``enginekit.model.ModelRequest``; its weights relative to the file)."""
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
        return BuildRequest(**self._build_options(cell, overrides))

    def _build_options(self, cell: Union["Cell", str], overrides: Optional[dict] = None) -> dict:
        if isinstance(cell, str):
            cell = Cell(cell, self.cells(overrides)[0].targets)
        options = {"target": self.variant, "declared": self.model.declared(), "precision": cell.precision,
                   "target_cc": cell.target_cc, "verify": self.verification.on_build}
        for option in HELD:  # the options a recipe key holds (options.py): read from their keys
            options[option.field] = self.held(option)
        if self.builder.repair:  # passed only when asked for, like the flag
            options.update(repair=True, tolerances=self.tolerances())
        extra = {k: v for k, v in (overrides or {}).items() if k not in ("precision", "target_cc")}
        if extra.get("tolerances"):  # --tol adds to the recipe's tolerances (later ones win)
            extra["tolerances"] = self.tolerances() + _given_tolerances(extra["tolerances"])
        if extra.get("weights") is not None:  # real weights on the command line beat random init
            options["random_init"] = False
        if extra.get("random_init"):
            options["weights"] = None
        if extra.get("imgsz") is not None:  # --imgsz on the command line replaces the recipe's profile
            options.pop("profiles", None)
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

    def held(self, option: Option) -> Any:
        """The value of ``option`` (options.py) in this recipe: at its key, a path relative to the recipe's folder."""
        value: Any = self
        for key in option.recipe:
            value = getattr(value, key)
        return self._file(value) if option.is_path else list(value) if isinstance(value, list) else value

    def _file(self, value: Optional[str]) -> Optional[Path]:
        """A path written in the recipe is relative to the recipe's folder."""
        if value is None:
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() else self._path.parent / path


def _given_tolerances(value: Any) -> Tolerances:
    """``--tol`` items given with a recipe (or a Tolerances), checked as a request checks them."""
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


