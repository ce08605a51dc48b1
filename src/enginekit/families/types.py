"""The types families share with the rest of the package: where weights come from, what loading gives,
NMS put in a graph, how ``enginekit models`` describes a family. Plain data: no family, no torch import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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


@dataclass(frozen=True)
class FamilyInfo:
    family: str
    task: str
    variants: list[str]
    default_input: str
    weights: str
    note: str
    #: ``--nms`` puts NMS in its graph (for the variants without an end-to-end head)
    nms: bool = False

    def to_json(self) -> dict:
        return {"family": self.family, "task": self.task, "variants": self.variants,
                "default_input": self.default_input, "weights": self.weights, "note": self.note, "nms": self.nms}
