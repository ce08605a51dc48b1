"""The model adapter (a family's one class) and what loading gives: weights identity, loaded model, NMS settings.

The export, verify and build stages and the runtime never branch on a family: they ask its adapter
for what ``families.interface`` declares (the module to export, inputs, tolerances, task metrics,
its processor).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from enginekit.cache import sha256_file
from enginekit.compare.parts import OutputPart, Tolerance  # noqa: F401 - re-exported
from enginekit.errors import UsageError
from enginekit.families.interface import Evaluation, Export, Registration, Runtime

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class WeightsSource:
    """Where a model's weights come from; its ``identity`` enters every cache key."""

    kind: str  # "file" | "hub" | "random" | "source" (weights that come with the model's source)
    ref: str  # path, hub name, or "architecture@seed"
    sha256: str | None = None  # file contents; None for hub (filled after load) and random

    @property
    def identity(self) -> str:
        if self.kind == "random":
            return f"random:{self.ref}"
        if self.kind == "source":
            return f"source:sha256:{self.sha256}"
        if self.sha256:
            return f"sha256:{self.sha256}"
        return f"hub:{self.ref}"


@dataclass(frozen=True)
class NmsSettings:
    """NMS put in the graph (``--nms``), with Ultralytics' export defaults for ``nms=True``:
    per-class NMS at IoU 0.7 of the boxes scoring above 0.25, at most 300 kept per image."""

    conf: float = 0.25
    iou: float = 0.7
    max_det: int = 300
    agnostic: bool = False
    #: how the graph suppresses: "greedy" (torchvision's greedy NMS, as graph_nms.greedy_nms) or
    #: "fast" (Ultralytics' Fast-NMS, its NMS for rotated boxes); both in ordinary operators
    form: str = "greedy"

    def to_json(self) -> dict:
        return {"conf": self.conf, "iou": self.iou, "max_det": self.max_det, "agnostic": self.agnostic,
                "form": self.form}

    def metadata(self, max_batch: int) -> dict[str, str]:
        """What the graph records of its NMS (``nms_*`` keys of the ONNX metadata)."""
        return {"nms": "True", "nms_conf": repr(self.conf), "nms_iou": repr(self.iou), "nms_max_det": str(self.max_det),
                "nms_agnostic": str(self.agnostic), "nms_max_batch": str(max_batch), "nms_form": self.form}


@dataclass
class LoadedModel:
    """An export-ready module (eval mode, FP32, CPU) and what it is."""

    module: "torch.nn.Module"
    name: str  # canonical variant name, e.g. "yolo12n"
    weights: WeightsSource
    metadata: dict[str, str] = field(default_factory=dict)


def folder_sha256(folder: Path) -> str:
    """One digest of a model folder: relative paths and contents of every file."""
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(folder).as_posix().encode())
            h.update(sha256_file(f).encode())
    return h.hexdigest()


def check_weights_file(path: Path) -> WeightsSource:
    if not path.exists():
        raise UsageError(f"weights file not found: {path}")
    if not path.is_file():
        raise UsageError(f"weights path is not a file: {path}")
    return WeightsSource("file", str(path), sha256_file(path))


class ModelAdapter(Registration, Export, Evaluation, Runtime):
    """A model family: one class that declares what each job needs of it (``families.interface``).

    An instance serves one variant (``resolve("yolo12n")``); ``nms`` is the NMS put in its graph
    (``with_nms``), or None: the family's own outputs."""

    def __init__(self, variant: str):
        self.variant = variant
        self.nms: NmsSettings | None = None


def seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def describe_load_error(exc: BaseException, what: str) -> str:
    """One line from a loader exception, for messages that must not be tracebacks."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{what}: {text[:300]}"
