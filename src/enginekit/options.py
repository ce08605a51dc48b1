"""Each shared option of the verbs, declared once: its request field, flags, help line and panel, default,
limits, check, and the key a recipe keeps it under.

Plain data, cheap to import (``enginekit --help`` reads it; no pydantic here): a request types its field with
``requests.typed(OPTION)`` (the limits and the check become the field's), a recipe section types its key the same
way (the same limits and check, its errors naming file, line and key), ``Recipe.build_request`` reads each option
from its key, and the CLI makes the Typer option of it (``cli.common.cli_option``: flags, help, panel, default).
An option's groups (``MODEL``, ``ENGINE``...) are what a command adds in one piece (build's engine options are
verify's too).

A check takes the value (a list option's: each item) and returns it, or raises ``ValueError`` with a message that does not repeat the option's
name: a request's error says ``--workspace: ...``, a recipe's ``builder.workspace: ...``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

# Help panels by concern, shared by every verb (``--help`` at 80 columns: one short line per option; the details
# live in docs/, which says where)
PANEL_MODEL = "Model and weights"
PANEL_INPUT = "Input"
PANEL_BUILD = "Precision and build"
PANEL_CALIB = "Calibration (INT8)"
PANEL_GATES = "Gates"
PANEL_IMAGES = "Images and labels"
PANEL_REPORTS = "Reports"
PANEL_STORE = "Team store"
PANEL_RUN = "Running"
PANEL_STREAM = "Stream"
# What a model enginekit cannot know by itself declares (torchvision:, timm:, file.py:factory, programs): the same
# names in a recipe's model: section and as keywords of enginekit.load (docs/models.md)
PANEL_DECLARE = "Model declaration (torchvision:, timm:, file.py:factory)"

SEED_MAX = 2**32 - 1
# TensorRT takes a workspace limit as a 64-bit size: larger is no machine's and overflows its binding.
WORKSPACE_MAX = 2**63 - 1
# Opsets the exporter writes: torch.onnx's TorchScript exporter (stages/export.py, dynamo=False)
# takes ONNX_MIN_OPSET..ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET (tests check these against torch).
OPSET_MIN, OPSET_MAX = 7, 20


@dataclass(frozen=True)
class Option:
    """One option: ``field`` of the requests that take it, spelled ``flags`` on the command line."""

    field: str
    flags: tuple[str, ...]
    type: Any  # as the request holds it: int, Optional[str], list[str]...
    default: Any
    help: str  # one line of --help
    panel: str
    recipe: Optional[tuple[str, ...]] = None  # the recipe key that holds it (("calibration", "count")); None: none
    limits: dict = field(default_factory=dict)  # pydantic Field limits: ge, le
    check: Optional[Callable[[Any], Any]] = None  # value (a list's: each item) -> value, or ValueError(message)
    hidden: bool = False

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def parameter(self) -> str:
        """The Python name of the flag (``--trt`` -> ``trt``): the CLI command's parameter."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def is_path(self) -> bool:
        return Path in getattr(self.type, "__args__", (self.type,))


# -- checks (a message without the option's name) ------------------------------------------------------------
def workspace_problem(text: str) -> Optional[str]:
    """What is wrong with a builder workspace limit (``"4G"``), or None: more than 0, at most what TensorRT takes."""
    from enginekit.errors import UsageError
    from enginekit.units import parse_size

    try:
        size = parse_size(text)
    except UsageError as exc:
        return str(exc)
    if size <= 0:
        return "a workspace of no bytes leaves the builder no memory; give like 4G"
    if size > WORKSPACE_MAX:
        return f"more than TensorRT takes (at most {WORKSPACE_MAX} bytes, 8 EiB); give like 4G"
    return None


def _workspace(value: Optional[str]) -> Optional[str]:
    problem = value is not None and workspace_problem(value)
    if problem:
        raise ValueError(f"{problem} (got {value!r})")
    return value


def _flavour(value: str) -> str:
    from enginekit.trt.flavours import FLAVOURS

    if value not in FLAVOURS:
        raise ValueError(f"unknown TensorRT flavour {value!r}: choose {', '.join(FLAVOURS)}")
    return value


def _calibration_method(value: Optional[str]) -> Optional[str]:
    from enginekit.stages.int8 import CALIBRATION_METHODS

    if value is not None and value not in (*CALIBRATION_METHODS, "auto"):
        raise ValueError(f"unknown calibration method {value!r}: choose {', '.join(CALIBRATION_METHODS)} or auto (each "
                         "calibrated and judged on images apart from calibration, the best kept)")
    return value


def _regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"bad regex {pattern!r}: {exc}") from exc
    return pattern


def _profile(text: str) -> str:
    from enginekit.errors import UsageError
    from enginekit.shapes import parse_profile

    try:
        parse_profile(text)
    except UsageError as exc:
        raise ValueError(str(exc)) from exc
    return text


def _opset(value: int) -> int:
    if not OPSET_MIN <= value <= OPSET_MAX:
        raise ValueError(f"the exporter writes opsets {OPSET_MIN} to {OPSET_MAX} (got {value})")
    return value


# -- the model and its weights ---------------------------------------------------------------------------------
WEIGHTS = Option("weights", ("--weights", "-w"), Optional[Path], None,
                 "Local weights: .pt, .pth, .safetensors or a model folder (docs/models.md).", PANEL_MODEL,
                 recipe=("model", "weights"))
RANDOM_INIT = Option("random_init", ("--random-init",), bool, False, "Seeded random weights (no download).",
                     PANEL_MODEL, recipe=("model", "random_init"))
SEED = Option("seed", ("--seed",), int, 0, "Seed of --random-init and test inputs.", PANEL_MODEL,
              recipe=("model", "seed"), limits={"ge": 0, "le": SEED_MAX})
NMS = Option("nms", ("--nms",), bool, False, "NMS in the graph, as Ultralytics' nms=True (detectors).", PANEL_MODEL)
OPSET = Option("opset", ("--opset",), int, 18, "ONNX opset.", PANEL_BUILD, recipe=("model", "opset"), check=_opset)
PROFILES = Option("profiles", ("--profile", "-p"), list[str], [],
                  "Engine profile NxCxHxW or min:opt:max; repeat for more profiles.", PANEL_INPUT,
                  recipe=("profiles",), check=_profile)

# -- what building an engine takes (build's; verify's to find or build the engine build would) -----------------
TRT = Option("flavour", ("--trt",), str, "auto",
             "The TensorRT that builds: auto (TensorRT where it runs, else TensorRT-RTX), tensorrt or tensorrt-rtx.",
             PANEL_BUILD, recipe=("trt",), check=_flavour)
TARGET_CC = Option("target_cc", ("--target-cc",), Optional[str], None,
                   "TensorRT-RTX compute capabilities, e.g. 8.6,8.9,12.0.", PANEL_BUILD)  # a recipe: targets:, a list
WORKSPACE = Option("workspace", ("--workspace",), Optional[str], None, "Builder workspace limit, e.g. 4G.",
                   PANEL_BUILD, recipe=("builder", "workspace"), check=_workspace)
OPT_LEVEL = Option("opt_level", ("--opt-level",), Optional[int], None, "Builder optimization level 0..5.",
                   PANEL_BUILD, recipe=("builder", "opt_level"), limits={"ge": 0, "le": 5})
CALIB_DATA = Option("calib_data", ("--calib-data",), Optional[Path], None,
                    "Images, dataset YAML, video or .npy/.npz.", PANEL_CALIB, recipe=("calibration", "data"))
CALIB_COUNT = Option("calib_count", ("--calib-count",), int, 8, "Calibration inputs.", PANEL_CALIB,
                     recipe=("calibration", "count"), limits={"ge": 1})
CALIB_METHOD = Option("calib_method", ("--calib-method",), Optional[str], None,
                      "max, entropy, or auto: each judged, the best kept (default: the family's; the "
                      "others too where it fails on --calib-data's other images).", PANEL_CALIB,
                      recipe=("calibration", "method"), check=_calibration_method)
CALIB_CACHE = Option("calib_cache", ("--calib-cache",), Optional[Path], None,
                     "Calibration cache to read (if it exists) or write.", PANEL_CALIB, recipe=("calibration", "cache"))
EXCLUDE = Option("exclude", ("--exclude",), list[str], [], "Node regex kept out of INT8 (repeatable).", PANEL_CALIB,
                 recipe=("calibration", "exclude"), check=_regex)

# -- the model's declaration (families.torch_models.spec checks it; a request holds it as ``declared``) ----------
def _declared(name: str, type_: Any, default: Any, help_: str, recipe: Optional[str] = None) -> Option:
    return Option(name, (f"--{name}",), type_, default, help_, PANEL_DECLARE,
                  recipe=("model", recipe or name) if recipe != "" else None)


TASK = _declared("task", Optional[str], None, "semantic, classify, depth or raw (parity only).")
OUTPUTS = _declared("outputs", Optional[str], None, "NAME[:MEANING],... e.g. out:logits,aux:logits.")
SIZE = _declared("size", Optional[str], None, "Input HxW when no --input/--profile says.")
DYNAMIC = _declared("dynamic", Optional[str], None, "Symbolic axes besides batch: hw or none.")
MEAN = _declared("mean", Optional[str], None, "Per-channel mean of 0..1 pixels, e.g. 0.485,0.456,0.406.")
STD = _declared("std", Optional[str], None, "Per-channel std, e.g. 0.229,0.224,0.225.")
RESIZE = _declared("resize", Optional[str], None, "stretch, letterbox (grey 114) or crop.")
BGR = _declared("bgr", bool, False, "The model takes BGR (default RGB).", recipe="")  # a recipe: channels: bgr
CLASSES = _declared("classes", Optional[int], None, "torchvision/timm: this many classes.")

#: the declaration's options, in --help's order (export, build, verify, tune, predict, deploy take them)
DECLARATION = (TASK, OUTPUTS, SIZE, DYNAMIC, MEAN, STD, RESIZE, BGR, CLASSES)
#: build's builder and calibration options, in --help's order (verify takes them too)
ENGINE = (TRT, TARGET_CC, WORKSPACE, OPT_LEVEL, CALIB_DATA, CALIB_COUNT, CALIB_METHOD, CALIB_CACHE, EXCLUDE)
#: the weights options of every verb that loads a PyTorch model
MODEL = (WEIGHTS, RANDOM_INIT, SEED, NMS)
#: every option declared here, by request field
BY_FIELD = {o.field: o for o in (*MODEL, OPSET, PROFILES, *ENGINE)}
