"""What every model family offers the pipeline.

The export, verify and build stages never branch on a family: they ask its adapter for
the module to export, the example inputs, the dynamic axes, preprocessing and tolerances.
"""

from __future__ import annotations

import dataclasses

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from enginekit.cache import sha256_file
from enginekit.compare.parts import OutputPart, Tolerance  # noqa: F401 - re-exported
from enginekit.errors import UsageError
from enginekit.shapes import InputConstraint, Shape

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class WeightsSource:
    """Where a model's weights come from; its ``identity`` enters every cache key."""

    kind: str  # "file" | "hub" | "random"
    ref: str  # path, hub name, or "architecture@seed"
    sha256: str | None = None  # file contents; None for hub (filled after load) and random

    @property
    def identity(self) -> str:
        if self.kind == "random":
            return f"random:{self.ref}"
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


class ModelAdapter:
    """Base class of a model family. Subclasses fill in the class attributes and methods."""

    family: str = ""
    #: the task, in Ultralytics' words ("detect", "segment", "pose", "obb", "classify", "semantic", "depth")
    task: str = ""
    #: the library that builds the model (its version enters the export key)
    framework: str = ""
    #: short names that resolve to a variant of this family (``{"depth": "depth-anything-v2-small"}``)
    aliases: dict[str, str] = {}
    #: one name, for the message that lists what is known
    example: str = ""
    #: ``--weights`` may name a model folder (transformers' layout), not only a checkpoint file
    weights_folders: bool = False
    #: which picture verify draws of a candidate on a photograph, or None: "detections" (reference and
    #: candidate boxes over the input, from ``picture_boxes``), "depth" (a depth error heatmap) or "semantic"
    #: (class maps and where they differ), both from ``picture_map``
    picture_kind: str | None = None
    input_name: str = ""
    output_names: tuple[str, ...] = ()
    default_input: Shape = ()
    #: axes of each input/output that stay symbolic in the exported graph
    dynamic_axes: dict[str, dict[int, str]] = {}
    #: input layout and normalisation, written into the ONNX metadata
    input_description: str = ""
    #: node-name patterns (regex) that FP16 conversion keeps in FP32 for this family
    fp16_keep_fp32: tuple[str, ...] = ()
    #: node-name patterns (regex) kept out of INT8 quantization by default
    int8_exclude: tuple[str, ...] = ()
    #: INT8 calibration method when none is asked for (``--calib-method``)
    int8_calibration: str = "entropy"
    #: the runtime's pre/postprocessing of this family (``load()``, ``enginekit predict``), as
    #: "module:Class" under enginekit.runtime (imported only there); "" where the runtime does not run it
    runtime_processor: str = ""
    #: what ``--random-init`` does beyond the architecture's own initialisation, named in the weights
    #: identity (and so in every cache key): "" where the seeded build is used as it comes
    random_init_tag: str = ""
    #: the exported graph's attention is PyTorch's scaled_dot_product_attention as plain operators, which
    #: ``enginekit.onnx.attention`` can fuse: the ONNX Runtime CUDA backend then runs a fused copy
    fusable_attention: bool = False

    def __init__(self, variant: str):
        self.variant = variant
        #: NMS put in the graph (``with_nms``), or None: the family's own outputs
        self.nms: NmsSettings | None = None

    # -- NMS in the graph (``--nms``) ----------------------------------------------------------
    #: the NMS the ``--nms`` graph holds (``NmsSettings.form``); no form needs a builder's NMS layer
    nms_form = "greedy"

    def nms_refusal(self) -> str | None:
        """Why ``--nms`` does not apply to this model (one line), or None where it does."""
        return f"{self.variant} is a {self.task or self.family} model: --nms applies to detectors"

    def with_nms(self, settings: NmsSettings | None = None) -> "ModelAdapter":
        """This adapter, with NMS in the exported graph: its output is the kept boxes, as an
        end-to-end head's. A one-line UsageError where the model has no NMS to add."""
        reason = self.nms_refusal()
        if reason is not None:
            raise UsageError(f"--nms: {reason}")
        adapter = type(self)(self.variant)
        adapter.nms = dataclasses.replace(settings or NmsSettings(), form=self.nms_form)
        return adapter

    def export_module(self, loaded: LoadedModel, batch: int) -> "torch.nn.Module":
        """The module traced with a ``batch``-image example (the loaded one, unless NMS needs to know)."""
        return loaded.module

    # -- registry (families.registry asks these; no family is named outside its module) --
    @classmethod
    def matches(cls, name: str) -> bool:
        """Whether ``name`` (lower case, aliases resolved) is a variant of this family."""
        return False

    @classmethod
    def near_miss(cls, name: str) -> str | None:
        """A hint when ``name`` looks like this family's but is not one of its variants."""
        return None

    @classmethod
    def describe(cls):
        """One ``families.registry.FamilyInfo`` row for ``enginekit models``."""
        raise NotImplementedError

    # -- identity -------------------------------------------------------------------------
    @property
    def constraint(self) -> InputConstraint:
        raise NotImplementedError

    def tolerance(self, precision: str) -> Tolerance:
        raise NotImplementedError

    def output_parts(self, metadata: dict[str, str] | None = None) -> tuple[OutputPart, ...]:
        """The outputs by meaning; by default each output tensor is one part."""
        return tuple(OutputPart(name, name) for name in self.output_names)

    def parity_outputs(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                       metadata: dict[str, str]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The outputs parity compares, row for row; by default as they come."""
        return reference, candidate

    def known_parts(self) -> tuple[str, ...]:
        """Every part name this family may declare (for checking ``--tol PART.NAME``)."""
        return tuple(p.name for p in self.output_parts({}))

    def nothing_to_compare(self, task: dict[str, float]) -> str:
        """Why task metrics with ``compared == 0`` say nothing, in the user's words."""
        return "the reference offers nothing to compare"

    def part_tolerance(self, precision: str, part: str) -> Tolerance:
        """Parity limits of one output part; by default the precision's tolerance."""
        return self.tolerance(precision)

    #: per precision: task metric -> (">=" or "<=", limit); the reference's predictions are truth
    task_gates: dict[str, dict[str, tuple[str, float]]] = {}
    #: task options (not gates) a user may set like a tolerance, with their defaults: ``conf=0.1``
    task_options: dict[str, float] = {}

    def task_metrics(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                     metadata: dict[str, str], options: dict[str, float] | None = None) -> dict[str, float]:
        """Task metrics of a candidate's outputs against the reference's, on real photographs.

        ``compared`` in the result counts what the reference offers to compare (its detections,
        its valid pixels): zero means the metrics say nothing, and the gate fails."""
        raise NotImplementedError

    # -- verify's picture (``picture_kind``) ---------------------------------------------
    def picture_boxes(self, outputs: dict[str, np.ndarray], metadata: dict[str, str], hw: tuple[int, int],
                      conf: float) -> np.ndarray:
        """"detections": the first image's boxes scoring ``conf`` or more, decoded as the task metrics
        decode them, in the input's pixels (``hw``): (N, 4) corners x1 y1 x2 y2, or (N, 5) rotated boxes
        (centre x, centre y, width, height, angle in radians)."""
        raise NotImplementedError

    def picture_map(self, outputs: dict[str, np.ndarray], metadata: dict[str, str]) -> np.ndarray:
        """"depth" and "semantic": the first image's map (H, W): its depth, or its class ids."""
        raise NotImplementedError

    # -- loading ------------------------------------------------------------------------
    def load(self, weights: Path | None, *, random_init: bool, seed: int) -> LoadedModel:
        raise NotImplementedError

    # -- inputs -------------------------------------------------------------------------
    def example_input(self, shape: Shape) -> "torch.Tensor":
        """The tracing example. Batch 2 so no exporter mistakes batch for a constant."""
        import torch

        n, c, h, w = shape
        g = torch.Generator().manual_seed(0)
        return torch.rand((max(n, 2), c, h, w), generator=g)

    def random_inputs(self, shape: Shape, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return rng.random(shape, dtype=np.float32)

    def preprocess(self, image_rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        """HxWx3 uint8 RGB -> 1x3xHxW float32, exactly as the reference pipeline does it."""
        raise NotImplementedError

    # -- reference ------------------------------------------------------------------------
    def reference(self, loaded: LoadedModel, batch: np.ndarray) -> dict[str, np.ndarray]:
        """The PyTorch forward on a batch, as numpy outputs keyed by output name."""
        import torch

        with torch.inference_mode():
            out = loaded.module(torch.from_numpy(batch))
        if not isinstance(out, (tuple, list)):
            out = (out,)
        return {n: o.float().numpy() for n, o in zip(self.output_names, out)}

    def onnx_metadata(self, loaded: LoadedModel) -> dict[str, str]:
        from enginekit import __version__

        meta = {
            "enginekit_version": __version__,
            "model": loaded.name,
            "family": self.family,
            "weights": loaded.weights.identity,
            "input_layout": self.input_description,
        }
        meta.update(loaded.metadata)
        return meta


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
