"""What a model family provides, in one place, split by the job that asks for it.

A family is one class (``families.base.ModelAdapter``) that declares four things, each an ABC here:

- :class:`Registration`: which names it serves and how ``enginekit models`` lists it (the registry);
- :class:`Export`: loading, the module to export, inputs, dynamic axes, input constraints, ONNX metadata,
  FP16/INT8 keep-lists, the calibration default, the random-init tag and hub weights (the pipeline);
- :class:`Evaluation`: outputs by meaning, pairing of rows before parity, tolerances, task gates and
  options, task metrics, the picture verify draws and the "nothing to compare" wording (verify);
- :class:`Runtime`: the pre/postprocessing class ``load()`` runs it with (:class:`Processor`).

Methods marked abstract must be written; the attributes each ABC lists must be set where they have no
default. :func:`check_declared` says what a registered class still lacks (``families.registry.register``
calls it), so a new family fails at import with the list, not later in a stage. Nothing outside
``families/`` branches on a family's name: what differs is declared here and asked for.

Evaluation by task (instances, classify, semantic, depth) is written once in ``families.evaluation``; a
family mixes in its task's and declares only its decoding (outputs -> instances) and what differs.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from enginekit.compare.parts import OutputPart, Tolerance
from enginekit.errors import UsageError
from enginekit.shapes import InputConstraint, Shape
from enginekit.families.types import FamilyInfo, LoadedModel, NmsSettings
from enginekit._version import __version__

if TYPE_CHECKING:
    import torch


#: the tasks a family may declare, in Ultralytics' words; "raw": outputs of no known task (parity only)
TASKS = ("detect", "segment", "pose", "obb", "classify", "semantic", "depth", "raw")
#: the pictures verify draws (``verification.pictures.PICTURES``): what each needs of the family
PICTURE_KINDS = {"detections": "picture_boxes", "depth": "picture_map", "semantic": "picture_map"}


class Registration(ABC):
    """How the registry finds a family (``families.registry``): nothing else names a family."""

    #: the family's name, as ``enginekit models`` lists it and the ONNX metadata records it
    family: str = ""
    #: the task, in Ultralytics' words (one of ``TASKS``)
    task: str = ""
    #: short names that resolve to a variant of this family (``{"depth": "depth-anything-v2-small"}``)
    aliases: dict[str, str] = {}
    #: one name, for the message that lists what is known
    example: str = ""
    #: names reach ``matches`` and ``create`` as written, not lower-cased (file paths, Python names)
    keeps_case: bool = False
    #: the family takes what a user declares of a model (``--task``, ``--outputs``, preprocessing: a dict of
    #: ``families.torch_models.spec.ModelSpec`` fields) in ``create``; others refuse a declaration
    declarable: bool = False

    @classmethod
    def create(cls, name: str, declared: dict) -> "Registration":
        """The adapter of ``name`` (a variant ``matches`` accepted) with the user's declaration ({} if none)."""
        return cls(name)  # type: ignore[call-arg]

    @classmethod
    @abstractmethod
    def matches(cls, name: str) -> bool:
        """Whether ``name`` (lower case, aliases resolved) is a variant of this family."""

    @classmethod
    def near_miss(cls, name: str) -> str | None:
        """A hint when ``name`` looks like this family's but is not one of its variants."""
        return None

    @classmethod
    def from_file(cls, path: Path) -> "Registration | None":
        """The adapter of the model a file of this family's library holds whole (an Ultralytics ``best.pt``: its
        module), so that the file alone is the model, no name needed; None: not such a file."""
        return None

    @classmethod
    def from_metadata(cls, metadata: dict[str, str]) -> "Registration | None":
        """The adapter of a graph's model where its metadata says what the model is rather than naming one this
        family builds (a checkpoint's export, a file the family's library wrote); None: not such metadata."""
        return None

    @classmethod
    def adopt_metadata(cls, metadata: dict[str, str]) -> dict[str, str] | None:
        """A graph this family's own library exported (its metadata, not enginekit's) as enginekit's metadata
        (``model``, ``family``, ``task``, ``names``...); None where the graph is not its library's."""
        return None

    @classmethod
    @abstractmethod
    def describe(cls) -> "FamilyInfo":
        """One ``families.registry.FamilyInfo`` row for ``enginekit models``."""


class Export(ABC):
    """What export needs: the model, its inputs and outputs, and how the precision stages treat it."""

    #: the library that builds the model (its version enters the export key: ``pipeline.model_versions``)
    framework: str = ""
    #: ``--weights`` may name a model folder (transformers' layout), not only a checkpoint file
    weights_folders: bool = False
    input_name: str = ""
    output_names: tuple[str, ...] = ()
    #: the rank each output of its graphs has (checked when a graph or engine is loaded: a file whose metadata names
    #: this family but whose outputs are another's is refused there); {}: not checked
    output_ranks: dict[str, int] = {}
    #: the shape ``enginekit export`` uses when none is given (N, C, H, W)
    default_input: Shape = ()
    #: axes of each input/output that stay symbolic in the exported graph
    dynamic_axes: dict[str, dict[int, str]] = {}
    #: a graph with dynamic H/W is exported at the first profile's opt size, which it records (``export_shape``)
    #: as the size the runtime letterboxes frames to (YOLO: its ``imgsz``); False: at ``default_input`` whatever
    #: the profiles (Depth-Anything resizes in the graph)
    export_at_profile_size: bool = False
    #: input layout and normalisation, written into the ONNX metadata
    input_description: str = ""
    #: what happens to an input size, written into the build manifest ("" where the graph takes the size as is)
    size_note: str = ""
    #: node-name patterns (regex) that FP16 conversion keeps in FP32 for this family
    fp16_keep_fp32: tuple[str, ...] = ()
    #: node-name patterns (regex) kept out of INT8 quantization by default
    int8_exclude: tuple[str, ...] = ()
    #: INT8 calibration method when none is asked for (``--calib-method``)
    int8_calibration: str = "entropy"
    #: what ``--random-init`` does beyond the architecture's own initialisation, named in the weights
    #: identity (and so in every cache key): "" where the seeded build is used as it comes
    random_init_tag: str = ""
    #: the exported graph's attention is PyTorch's scaled_dot_product_attention as plain operators, which
    #: ``enginekit.onnx.attention`` can fuse: the ONNX Runtime CUDA backend then runs a fused copy
    fusable_attention: bool = False
    #: the NMS the ``--nms`` graph holds (``NmsSettings.form``), where ``nms_refusal`` allows one
    nms_form: str = "greedy"
    # per instance: ``variant`` (the resolved name) and ``nms`` (NmsSettings put in the graph, or None)
    variant: str
    nms: "NmsSettings | None"

    @property
    @abstractmethod
    def constraint(self) -> InputConstraint:
        """What an input shape must satisfy (channels, multiple of the stride)."""

    @abstractmethod
    def load(self, weights: Path | None, *, random_init: bool, seed: int) -> "LoadedModel":
        """The export-ready module from a weights path, the hub (``weights`` None) or a seeded random build.
        Bad weights: a one-line ``UsageError``."""

    def identity(self) -> dict:
        """What determines the model's outputs beyond its name, weights and library versions (a user
        module's source digest, a declared task, outputs and preprocessing): part of every key that names
        the model (export, references). {} where the name says it all."""
        return {}

    def check_source(self) -> None:
        """Refuse, in one line, a model whose source cannot be loaded (a missing file), before any work."""

    def check_weights(self, weights: Path) -> None:
        """Refuse, in one line, a weights file that is not this model's (before any cached artifact is served)."""

    def trace_shape(self, shape: Shape) -> Shape:
        """The shape the exporter traces at and simplify proves the graph at, for an export at ``shape``: the
        same by default. A graph dynamic in H and W is one graph at any size, so a family may trace it smaller."""
        return shape

    def key_model(self, weights_file: bool) -> str:
        """The model's part of an export key: its name; where a weights file holds the whole module (an Ultralytics
        checkpoint), what says so instead, as the file's content (beside it in the key) is the model."""
        return self.variant

    def describe_model(self) -> str:
        """One phrase on what the model is, for notes ("a detect model, 2 classes (built from yolov8s.yaml)")."""
        return f"a {getattr(self, 'task', '')} model ({getattr(self, 'family', '')})"

    @property
    def portable_name(self) -> str:
        """The model's name as another working folder can load it again (a file's absolute path)."""
        return self.variant

    @property
    def output_stem(self) -> str:
        """The file-name stem of what ``enginekit export`` writes (``yolo12n`` -> ``yolo12n.onnx``)."""
        return self.variant

    def own_weights_identity(self, seed: int) -> str | None:
        """The identity of weights that come with the model's source (no weights file, no random init),
        where the family has such weights: ``source:sha256:...``; None: the hub's (``hub_weights``)."""
        return None

    def hub_weights(self) -> Path:
        """The local file the variant's hub name resolves to (downloaded if need be): its content, not its
        name, keys every stage of a hub model. A one-line ``UsageError`` where there is none."""
        raise UsageError(f"{self.variant} has no hub weights: pass --weights PATH, or --random-init")

    def save_checkpoint(self, loaded: "LoadedModel", path: Path) -> None:
        """Write the loaded model's weights in the form ``load`` reads back (tests make checkpoints so)."""
        raise NotImplementedError(f"{type(self).__name__} writes no checkpoints")

    @abstractmethod
    def preprocess(self, image_rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        """HxWx3 uint8 RGB -> 1x3xHxW float32, exactly as the reference pipeline does it."""

    def rect_hw(self, image_hw: tuple[int, int], hw: tuple[int, int]) -> tuple[int, int] | None:
        """Where the reference pipeline letterboxes a frame to the smallest rectangle around it rather than to the
        network's full size (YOLO's ``.pt`` predict: ``LetterBox(auto=True)``), the H x W a frame of ``image_hw``
        gets at network size ``hw``; None: every frame goes to ``hw`` (``preprocess``)."""
        return None

    def letterboxes_rect(self) -> bool:
        """Whether ``rect_hw`` gives rectangles (the family's own answer, without computing one)."""
        return type(self).rect_hw is not Export.rect_hw

    def preprocess_rect(self, image_rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        """HxWx3 uint8 RGB -> 1x3xhxw float32 at the frame's rectangle (``rect_hw``) for network size ``hw``."""
        raise NotImplementedError(f"{type(self).__name__} letterboxes every frame to the network's size")

    def example_input(self, shape: Shape) -> "torch.Tensor":
        """The tracing example. Batch 2 so no exporter mistakes batch for a constant."""
        import torch

        n, c, h, w = shape
        g = torch.Generator().manual_seed(0)
        return torch.rand((max(n, 2), c, h, w), generator=g)

    def random_inputs(self, shape: Shape, seed: int) -> np.ndarray:
        """A random input of ``shape``, as parity's random case feeds it."""
        return np.random.default_rng(seed).random(shape, dtype=np.float32)

    def export_module(self, loaded: "LoadedModel", batch: int) -> "torch.nn.Module":
        """The module traced with a ``batch``-image example (the loaded one, unless NMS needs to know)."""
        return loaded.module

    def adopt_outputs(self, names: tuple[str, ...]) -> None:
        """The model's output names, as its loaded module or its stored references give them: a family whose
        outputs are found by loading the model takes them here (a cache hit loads no model). Others: nothing."""

    def reference(self, loaded: "LoadedModel", batch: np.ndarray) -> dict[str, np.ndarray]:
        """The PyTorch forward on a batch, as numpy outputs keyed by output name."""
        import torch

        with torch.inference_mode():
            out = loaded.module(torch.from_numpy(batch))
        if not isinstance(out, (tuple, list)):
            out = (out,)
        return {n: o.float().numpy() for n, o in zip(self.output_names, out)}

    def onnx_metadata(self, loaded: "LoadedModel") -> dict[str, str]:
        """What the exported graph records of itself (``enginekit`` keys, then the loaded model's)."""
        meta = {"enginekit_version": __version__, "model": loaded.name, "family": getattr(self, "family", ""),
                "weights": loaded.weights.identity, "input_layout": self.input_description}
        meta.update(loaded.metadata)
        return meta

    def nms_refusal(self) -> str | None:
        """Why ``--nms`` does not apply to this model (one line), or None where it does."""
        return f"{self.variant} is a {getattr(self, 'task', '') or getattr(self, 'family', '')} model: --nms applies to detectors"

    def with_nms(self, settings: "NmsSettings | None" = None) -> "Export":
        """This adapter, with NMS in the exported graph: its output is the kept boxes, as an
        end-to-end head's. A one-line UsageError where the model has no NMS to add."""
        import copy
        import dataclasses

        reason = self.nms_refusal()
        if reason is not None:
            raise UsageError(f"--nms: {reason}")
        adapter = copy.copy(self)  # what the instance knows of its model (a checkpoint's facts) comes along
        adapter.nms = dataclasses.replace(settings or NmsSettings(), form=self.nms_form)
        return adapter


class Evaluation(ABC):
    """What verify needs (``compare.comparison.Family`` is the part the comparison calls)."""

    #: per precision: task metric -> (">=" or "<=", limit); the reference's predictions are truth
    task_gates: dict[str, dict[str, tuple[str, float]]] = {}
    #: task options (not gates) a user may set like a tolerance, with their defaults: ``conf=0.1``
    task_options: dict[str, float] = {}
    #: which picture verify draws of a candidate on a photograph (``PICTURE_KINDS``), or None: "detections"
    #: (reference and candidate boxes over the input, from ``picture_boxes``), "depth" (a depth error
    #: heatmap) or "semantic" (class maps and where they differ), both from ``picture_map``
    picture_kind: str | None = None

    @abstractmethod
    def tolerance(self, precision: str) -> Tolerance:
        """Parity limits of a whole output at ``precision``."""

    def part_tolerance(self, precision: str, part: str) -> Tolerance:
        """Parity limits of one output part; by default the precision's tolerance."""
        return self.tolerance(precision)

    def output_parts(self, metadata: dict[str, str] | None = None) -> tuple[OutputPart, ...]:
        """The outputs by meaning; by default each output tensor is one part."""
        return tuple(OutputPart(name, name) for name in getattr(self, "output_names", ()))

    def known_parts(self) -> tuple[str, ...]:
        """Every part name this family may declare (for checking ``--tol PART.NAME``)."""
        return tuple(p.name for p in self.output_parts({}))

    def parity_outputs(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                       metadata: dict[str, str]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The outputs parity compares, row for row (kept-box rows paired first); by default as they come."""
        return reference, candidate

    @abstractmethod
    def task_metrics(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                     metadata: dict[str, str], options: dict[str, float] | None = None) -> dict[str, float]:
        """Task metrics of a candidate's outputs against the reference's, on real photographs.

        ``compared`` in the result counts what the reference offers to compare (its detections,
        its valid pixels): zero means the metrics say nothing, and the gate fails."""

    def nothing_to_compare(self, task: dict[str, float]) -> str:
        """Why task metrics with ``compared == 0`` say nothing, in the user's words."""
        return "the reference offers nothing to compare"

    def picture_boxes(self, outputs: dict[str, np.ndarray], metadata: dict[str, str], hw: tuple[int, int],
                      conf: float) -> np.ndarray:
        """"detections": the first image's boxes scoring ``conf`` or more, decoded as the task metrics
        decode them, in the input's pixels (``hw``): (N, 4) corners x1 y1 x2 y2, or (N, 5) rotated boxes
        (centre x, centre y, width, height, angle in radians)."""
        raise NotImplementedError

    def picture_map(self, outputs: dict[str, np.ndarray], metadata: dict[str, str]) -> np.ndarray:
        """"depth" and "semantic": the first image's map (H, W): its depth, or its class ids."""
        raise NotImplementedError


@runtime_checkable
class Processor(Protocol):
    """A family's pre/postprocessing for the runtime (``enginekit.load``, ``enginekit predict``).

    Made as ``processor(adapter, metadata, info, conf=, iou=, max_det=, input_size=, gpu_letterbox=)``
    (``info``: the session's inputs/outputs and fixed H x W); options a task does not use are ignored.

    Optional, for a session on a GPU: ``host_step(frame_hw, hw)`` says whether a frame is first brought to
    ``hw`` on the host by ``preprocess_host(frame, hw)`` (HxWx3 uint8 in, HxWx3 uint8 at ``hw`` out), so that
    only exact steps run on the device (Ultralytics' letterbox: OpenCV, as its predictor)."""

    #: preprocess_gpu launches only device work: the predictor may capture it as a CUDA graph
    gpu_graphable: bool

    def input_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        """The network's H x W for an image of ``image_hw``."""

    def preprocess_cpu(self, rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        """HxWx3 uint8 RGB -> 3xhxw float32."""

    def preprocess_gpu(self, chw: Any, hw: tuple[int, int]) -> Any:
        """3xHxW float RGB (0..255) torch tensor on the GPU -> 3xhxw, on the current stream."""

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list:
        """The session's outputs -> one result per image (``enginekit.results``), in the original pixels."""


class Runtime(ABC):  # noqa: B024 - nothing to write: a family with no runtime declares none
    """What the runtime needs: the processor class, and what it reads where a graph does not say."""

    #: the pre/postprocessing class (``Processor``); None where the runtime does not run this family
    processor: type | None = None

    def default_class_names(self) -> dict[int, str]:
        """Class names for a graph that records none (no ``names`` metadata); {} where there is no default."""
        return {}


def check_declared(cls: type) -> None:
    """A TypeError naming what a family class still lacks: abstract methods, unset attributes, a picture
    with nothing to draw it from, a processor that is not a class."""
    problems = []
    if inspect.isabstract(cls):
        problems.append("write " + ", ".join(sorted(getattr(cls, "__abstractmethods__", ()))))
    for name in ("family", "task", "example", "framework", "input_name"):
        if not getattr(cls, name, ""):
            problems.append(f"set {name}")
    if not getattr(cls, "output_names", ()):
        problems.append("set output_names")
    if len(getattr(cls, "default_input", ())) != 4:
        problems.append("set default_input (N, C, H, W)")
    if getattr(cls, "task", "") and cls.task not in TASKS:
        problems.append(f"task {cls.task!r} is none of {', '.join(TASKS)}")
    kind = getattr(cls, "picture_kind", None)
    if kind is not None:
        needs = PICTURE_KINDS.get(kind)
        if needs is None:
            problems.append(f"picture_kind {kind!r} is none of {', '.join(PICTURE_KINDS)}")
        elif getattr(cls, needs) is getattr(Evaluation, needs):
            problems.append(f"write {needs} (picture_kind {kind!r} draws from it)")
    processor = getattr(cls, "processor", None)
    if processor is not None and not (inspect.isclass(processor) and all(
            callable(getattr(processor, m, None)) for m in ("input_hw", "preprocess_cpu", "postprocess"))):
        problems.append("processor must be a class with input_hw, preprocess_cpu and postprocess (Processor)")
    if problems:
        raise TypeError(f"family class {cls.__name__} does not declare what a family must: {'; '.join(problems)}")
