"""Any PyTorch vision model: torchvision, timm, a user's module or saved program (family ``pytorch``).

One registered class (:class:`TorchModelAdapter`) serves every reference ``families.torch_models.sources``
parses; ``create`` gives an instance of the class of the declared task, which mixes in that task's
evaluation (``families.evaluation``) and runtime processing (``families.torch_models.runtime``):

- ``semantic``: per-pixel class logits first; mIoU and pixel agreement of the class maps;
- ``classify``: class logits (or probabilities) first; top-1 agreement, top-5 overlap, probability shift;
- ``depth``: a depth map first; AbsRel and delta1 after scale and shift;
- ``raw``: every output compared by parity only (no task metrics, no runtime results).

Every declared output is a part of its own for parity (``out`` and ``aux`` of torchvision's DeepLabV3).
What the user declares, and the table's defaults, are in the keys of every stage (``identity``) and in
the exported graph's metadata (``declaration``), so a graph or engine knows how to feed and read itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from enginekit import precisions
from enginekit.compare.parts import OutputPart
from enginekit.errors import UsageError
from enginekit.families.base import (
    LoadedModel,
    ModelAdapter,
    Tolerance,
    WeightsSource,
    check_weights_file,
    seed_everything,
)
from enginekit.families.evaluation import ClassifyEvaluation, DepthEvaluation, SemanticEvaluation, label_gates
from enginekit.families.registry import register
from enginekit.families.types import FamilyInfo
from enginekit.families.torch_models import sources, table
from enginekit.families.torch_models.runtime import ClassifyProcessor, DepthProcessor, SemanticProcessor, place
from enginekit.families.torch_models.spec import TASK_MEANINGS, ModelSpec
from enginekit.shapes import InputConstraint, Shape
from enginekit.compare.label_metrics import SemanticScores
from enginekit.compare.task_metrics import class_maps, classify_metrics
from enginekit.families.processing import parse_names
from enginekit.families.torch_models.labels import read_classify_split, read_semantic_split
from enginekit.families.torch_models.runtime import frame_class_map
from enginekit.hashing import sha256_file
from enginekit.families.random_init import RANDOM_INIT_VERSION, informative_torch_model

FAMILY = "pytorch"
DEFAULT_SIZE = (224, 224)
#: a graph dynamic in H and W is the same graph whatever size it is traced at: traced at this side (or
#: the input's, if smaller), the tracing forward and simplify's equality check cost a fraction of the
#: input's size (deeplabv3_resnet50 at 512 px: measured in benchmarks/any_model.py)
TRACE_SIDE = 64

# Parity limits against the FP32 PyTorch reference, for any model (a family of one architecture measures
# its own; these hold for the suite's and the benchmark's models with an informative random init):
# measured on a 2-core x86-64 CPU, ONNX Runtime CPU, photographs + a random input:
#   lraspp_mobilenet_v3_large 224 px: fp32 rel L2 2e-7; fp16 1.3e-3; int8 (entropy) 0.06
#   deeplabv3_mobilenet_v3_large 256 px: fp32 3e-7; fp16 1.6e-3; int8 0.05
#   resnet18 128 px (logits): fp32 3e-7; fp16 6e-4; int8 0.04
#   deeplabv3_resnet50 512 px (benchmarks/any_model.py): fp32 out 7.3e-5, aux 2.6e-5 (mIoU 0.9996): FP32
#   sums in another order through 50 layers at 512 x 512
# Limits leave ~4-5x over those figures: other weights, sizes and GPU kernels round differently.
_TOLERANCES = {
    "fp32": Tolerance(rel_l2=3e-4, cosine=0.99999),
    "fp16": Tolerance(rel_l2=1e-2, cosine=0.9995),
    "int8": Tolerance(rel_l2=0.25, cosine=0.97),
    "fp8": Tolerance(rel_l2=0.25, cosine=0.97),
}
_PART_KINDS = {"logits": "values", "probabilities": "probabilities", "depth": "depth", "values": "values"}


@register
class TorchModelAdapter(ModelAdapter):
    """Any PyTorch model by reference; an instance is of its declared task's class (``create``)."""

    family = FAMILY
    task = "raw"
    framework = "torch"
    example = "torchvision:deeplabv3_resnet50"
    keeps_case = True
    declarable = True
    input_name = "images"
    output_names = ("output",)  # an instance's: declared, from the table, or found when the model loads
    default_input = (1, 3, *DEFAULT_SIZE)
    random_init_tag = f"photo-bn{RANDOM_INIT_VERSION}"
    # the names every task's gates and options use (``--tol`` checks against them); an instance has its own
    task_gates = {p: {**SemanticEvaluation.task_gates.get(p, {}), **ClassifyEvaluation.task_gates.get(p, {}),
                      "abs_rel": ("<=", 0.05), "delta1": (">=", 0.95)} for p in precisions.names()}

    def __init__(self, variant: str, *, declared: Any = None):
        super().__init__(variant)
        self.source = sources.parse(variant)
        self.declared = ModelSpec.of(declared)
        library = self.source.kind if self.source.kind in ("torchvision", "timm") else ""
        if self.declared.classes is not None and not library:
            raise UsageError(f"--classes {self.declared.classes}: torchvision and timm models are built with that many "
                             f"classes; {self.source.display} builds its own (set them in its code)")
        base, self.row = table.defaults(library, self.source.name) if library else (ModelSpec(), None)
        self.spec = self.declared.over(base)
        self.crop_fraction = table.crop_fraction(library, self.source.name) if library else 0.875
        self.variant = self.source.display
        self.framework = self.source.framework
        task = self.spec.task or "raw"
        if task != type(self).task and type(self).task != "raw":
            raise UsageError(f"{self.variant}: declared task {task} is not this adapter's ({type(self).task})")
        self._configure()

    @classmethod
    def create(cls, name: str, declared: dict) -> "TorchModelAdapter":
        """An instance of the class of the declared task (the table's where none is declared; else raw)."""
        spec = ModelSpec.of(declared)
        source = sources.parse(name)
        library = source.kind if source.kind in ("torchvision", "timm") else ""
        base = table.defaults(library, source.name)[0] if library else ModelSpec()
        return TASK_CLASSES[spec.over(base).task or "raw"](name, declared=spec)

    @classmethod
    def matches(cls, name: str) -> bool:
        return sources.looks_like(name)

    @classmethod
    def describe(cls) -> FamilyInfo:
        return FamilyInfo(
            cls.family, "declared", ["torchvision:NAME", "timm:NAME", "path/file.py:factory", "package.module:factory",
                                     "program.pt2 / program.pt (TorchScript)"],
            "declared (--size, --dynamic); torchvision/timm: their table's (deeplabv3_*: 512x512, classifiers 224)",
            "a state dict (--weights .safetensors/.pt/.pth), the library's published weights, a factory's own",
            "any PyTorch vision model; --task semantic|classify|depth|raw and --outputs say what its outputs mean")

    # -- the declaration, made attributes -----------------------------------------------------------
    def _configure(self) -> None:
        spec = self.spec
        task = spec.task or "raw"
        if spec.outputs:
            self.output_names = tuple(n for n, _ in spec.outputs)
            first = spec.outputs[0][1]
            if first not in TASK_MEANINGS[task]:
                raise UsageError(f"--outputs: a {task} model's first output holds "
                                 f"{' or '.join(TASK_MEANINGS[task])}, not {first} ({spec.outputs[0][0]})")
        else:
            self.output_names = ()  # found when the model loads
        if spec.resize == "crop" and task in ("semantic", "depth"):
            raise UsageError(f"--resize crop cuts the image: a {task} map covers all of it; use stretch or letterbox")
        self.default_input = (1, 3, *(spec.size or DEFAULT_SIZE))
        axes = spec.dynamic if spec.dynamic is not None else ("batch",)
        index = {"batch": 0, "height": 2, "width": 3}
        self.dynamic_axes = {self.input_name: {index[a]: a for a in axes}}
        self._output_axes()
        rgb = "BGR" if spec.channels == "bgr" else "RGB"
        how = {"letterbox": "letterboxed (grey 114) to HxW", "crop": f"shorter side to HxW/{self.crop_fraction:g}, "
               "centre-cropped to HxW"}.get(spec.resize or "stretch", "resized to HxW")
        norm = (f", normalised with mean {tuple(spec.mean)} and std {tuple(spec.std)}" if spec.mean or spec.std else "")
        self.input_description = f"NCHW {rgb} float32, {how}, /255{norm}"
        self.size_note = ("" if "height" in axes and "width" in axes else
                          f"fixed H x W: exported at the profile's size ({self.default_input[2]}x{self.default_input[3]} "
                          "by default)")

    def adopt_outputs(self, names: tuple[str, ...]) -> None:
        if not self.output_names:  # declared or already found: kept
            self.output_names = tuple(names)
            self._output_axes()

    def _output_axes(self) -> None:
        if "batch" in self.dynamic_axes[self.input_name].values():
            self.dynamic_axes.update({n: {0: "batch"} for n in self.output_names})

    @property
    def meanings(self) -> dict[str, str]:
        declared = dict(self.spec.outputs or ())
        task = self.spec.task or "raw"
        first = {"semantic": "logits", "classify": "logits", "depth": "depth"}.get(task, "values")
        return {n: declared.get(n, first if i == 0 else "values") for i, n in enumerate(self.output_names)}

    def resolved(self) -> dict[str, Any]:
        """The full declaration in force (the table's and the user's), as the graph records it."""
        outputs = tuple(self.meanings.items()) or None
        return ModelSpec(**{**self.spec.model_dump(), "outputs": outputs}).given()

    def identity(self) -> dict:
        # the declaration in force before loading (outputs found by loading follow from the source)
        return {**sources.identity(self.source), "declaration": self.spec.given()}

    def check_source(self) -> None:
        sources.check(self.source)

    @property
    def output_stem(self) -> str:
        return self.source.stem

    @property
    def portable_name(self) -> str:
        return self.source.text

    @property
    def constraint(self) -> InputConstraint:
        return InputConstraint(self.input_name, 3, 1, self.variant)

    def trace_shape(self, shape: Shape) -> Shape:
        n, c, h, w = shape
        dynamic = self.dynamic_axes[self.input_name].values()
        if "height" in dynamic and "width" in dynamic:
            h, w = min(h, TRACE_SIDE), min(w, TRACE_SIDE)
        return (n, c, h, w)

    def tolerance(self, precision: str) -> Tolerance:
        return _TOLERANCES[precision]

    def output_parts(self, metadata=None):
        return tuple(OutputPart(name, name, kind=_PART_KINDS[meaning]) for name, meaning in self.meanings.items())

    def known_parts(self):
        return tuple(self.output_names)

    def task_metrics(self, reference, candidate, metadata, options=None):
        return {}  # raw: parity only (a task class has its own)

    def default_class_names(self) -> dict[int, str]:
        if self.row is None or not self.row.names:
            return {}
        return table.class_names(self.row.names, self.spec.classes or 0)

    # -- loading ----------------------------------------------------------------------------------
    def _build_kwargs(self) -> dict:
        kwargs = dict(self.row.build) if self.row else {}
        if self.spec.classes is not None and self.source.kind in ("torchvision", "timm"):
            kwargs["num_classes"] = self.spec.classes
        return kwargs

    def hub_weights(self) -> Path:
        if self.source.kind in ("torchvision", "timm"):
            return sources.published_weights(self.source)
        raise UsageError(f"{self.variant} has no published weights: its own are keyed by their content")

    def own_weights_identity(self, seed: int) -> str | None:
        """Weights that come with the source (no --weights, no --random-init): a saved program's are its
        file's content; a factory's, the content of what it builds (so the factory runs to key them)."""
        if self.source.is_program:
            sources.check(self.source)
            return f"source:sha256:{_sha(self.source.path)}"
        if self.source.kind not in ("file", "module"):
            return None
        seed_everything(seed)
        module = sources.build(self.source, self._build_kwargs())
        return f"source:sha256:{sources.state_digest(module.float())}"

    def load(self, weights: Path | None, *, random_init: bool, seed: int) -> LoadedModel:
        source = self.source
        if random_init and source.is_program:
            raise UsageError(f"{self.variant} is a saved program with its weights: drop --random-init (or pass "
                             "--weights for other weights of the same program)")
        seed_everything(seed)
        module = sources.build(source, self._build_kwargs())
        if weights is not None:
            ws = check_weights_file(weights)
            sources.load_weights(module, weights, self.variant)
        elif random_init:
            ws = WeightsSource("random", f"{self.variant}+{self.random_init_tag}@{seed}")
        elif source.kind in ("torchvision", "timm"):
            path = self.hub_weights()
            sources.load_weights(module, path, f"{self.variant} (its published weights)")
            ws = WeightsSource("hub", source.display, _sha(path))
        elif source.is_program:
            ws = WeightsSource("source", source.display, _sha(source.path))
        else:
            ws = None  # a factory's own: the content of what it built (below)
        module = module.float().eval()
        for p in module.parameters():
            p.requires_grad_(False)
        if random_init:
            informative_torch_model(module, self, seed)
        wrapped = wrap_outputs(module, self)
        # "model": the name as any working folder loads it again (a file's absolute path), for verify and load
        meta = {"model": self.portable_name, "declaration": json.dumps(self.resolved(), sort_keys=True),
                "task": self.spec.task or "raw", "source": source.display}
        names = self.default_class_names()
        if names:
            meta["names"] = str(names)
        if ws is None:
            ws = WeightsSource("source", source.display, sources.state_digest(module))
        return LoadedModel(wrapped, self.variant, ws, meta)

    def save_checkpoint(self, loaded: LoadedModel, path: Path) -> None:
        import torch

        state = loaded.module.model.state_dict()
        if path.suffix == ".safetensors":
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        else:
            torch.save(state, path)

    # -- inputs -----------------------------------------------------------------------------------
    def preprocess(self, image_rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        spec = self.spec
        img = image_rgb[..., ::-1] if spec.channels == "bgr" else image_rgb
        x = place(img, hw, spec.resize or "stretch", self.crop_fraction).astype(np.float32) / 255.0
        if spec.mean is not None:  # per channel of the model's input, in its order
            x = x - np.asarray(spec.mean, np.float32)
        if spec.std is not None:
            x = x / np.asarray(spec.std, np.float32)
        return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)[None]

    def random_inputs(self, shape, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        if self.spec.mean is not None or self.spec.std is not None:  # what normalised images look like
            return rng.standard_normal(shape, dtype=np.float32)
        return rng.random(shape, dtype=np.float32)


def _sha(path: Path) -> str:
    return sha256_file(path)


def _outputs_class():
    import torch

    class _Outputs(torch.nn.Module):
        """The user's module with its outputs as a flat tuple in the declared order: a dict (torchvision's
        OrderedDict) by key, a tuple or list by position, a tensor as it is. The first call with no
        declared outputs names them (dict keys, else output0.., or ``output``)."""

        def __init__(self, model, adapter):
            super().__init__()
            self.model = model
            self.names = tuple(adapter.output_names)
            self._adapter = [adapter]  # not a submodule

        def forward(self, x):
            with sources.user_code(f"{self._adapter[0].variant}'s forward", capture=False):
                out = self.model(x)
            if isinstance(out, dict):
                missing = [n for n in self.names if n not in out]
                if missing:
                    raise UsageError(f"{self._adapter[0].variant} returns {', '.join(map(str, out))}; --outputs "
                                     f"names {', '.join(missing)}")
                return tuple(out[n] for n in self.names)
            if isinstance(out, (tuple, list)):
                flat = [o for o in out if isinstance(o, torch.Tensor)]
                if len(flat) != len(self.names):
                    raise UsageError(f"{self._adapter[0].variant} returns {len(flat)} tensors; --outputs names "
                                     f"{len(self.names)} ({', '.join(self.names)})")
                return tuple(flat)
            if not isinstance(out, torch.Tensor):
                raise UsageError(f"{self._adapter[0].variant} returns a {type(out).__name__}: a tensor, a tuple "
                                 "or a dict of tensors is what an ONNX graph can give")
            if len(self.names) != 1:
                raise UsageError(f"{self._adapter[0].variant} returns one tensor; --outputs names {len(self.names)}")
            return out

    return _Outputs


def _discover(model, adapter) -> tuple[str, ...]:
    """Output names of a model whose outputs were not declared: one small forward."""
    import torch

    n, c, h, w = adapter.trace_shape((2, *adapter.default_input[1:]))
    with torch.no_grad(), sources.user_code(f"{adapter.variant}'s forward", capture=False):
        out = model(torch.zeros(n, c, h, w))
    if isinstance(out, dict):
        return tuple(str(k) for k in out)
    if isinstance(out, (tuple, list)):
        count = sum(isinstance(o, torch.Tensor) for o in out)
        return tuple(f"output{i}" for i in range(count))
    return ("output",)


def wrap_outputs(model, adapter):
    """The module export traces and the reference runs: the user's, outputs flattened in the declared order."""
    if not adapter.output_names:
        adapter.adopt_outputs(_discover(model, adapter))
    return _outputs_class()(model, adapter).eval()


# -- the task classes -----------------------------------------------------------------------------------
def _random_weights(metadata: dict) -> bool:
    return str(metadata.get("weights", "")).startswith("random:")


class TorchSemantic(SemanticEvaluation, TorchModelAdapter):
    task = "semantic"
    task_gates = SemanticEvaluation.task_gates

    processor = SemanticProcessor
    output_parts = TorchModelAdapter.output_parts
    known_parts = TorchModelAdapter.known_parts

    def task_metrics(self, reference, candidate, metadata, options=None):
        result = SemanticEvaluation.task_metrics(self, reference, candidate, metadata, options)
        maps = class_maps(reference[self.output_names[0]])
        result["reference_varies"] = float(_maps_vary(maps))
        if _random_weights(metadata) and not result["reference_varies"]:
            result["compared"] = 0.0  # random weights, one map whatever the photograph: nothing to compare
        return result

    # -- against labels (verify --data; families.torch_models.labels) ----------------------------------
    #: the most a graph's mIoU against the labels may fall below the FP32 PyTorch model's (``gt.miou_drop``):
    #: fp32 0.002, fp16 0.01, int8 0.03, kept after measuring them on a trained segmenter
    #: (benchmarks/trained_segmenter.md: lraspp_mobilenet_v3_large, FP32 mIoU 0.873 on held-out composites;
    #: FP16 drop 0.0000, INT8 0.0025 with max and 0.0022 with entropy calibration, every node quantized; a
    #: graph with two classes' weights swapped drops 0.41)
    label_gates = label_gates("miou")

    def read_labels(self, dataset, split: str, metadata: dict[str, str], *, limit: int | None = None,
                    imgsz: int = 640):
        names, count = _model_classes(self, metadata)
        return read_semantic_split(dataset, split, names, count, model=self.variant, limit=limit)

    def label_scores(self, names: dict[int, str], metadata: dict[str, str]):
        return SemanticScores()

    def label_letterbox(self, image_hw: tuple[int, int], hw: tuple[int, int], rect: bool):
        return tuple(hw)  # every frame goes to the network's size: its class map comes back to the frame's

    def add_label_image(self, scores, split, sample, image_bgr, outputs, metadata, letterbox, max_det: int) -> None:
        """One image: the runtime's class map at the frame's size (``runtime.frame_class_map``) against its labels."""
        logits = np.asarray(outputs[self.output_names[0]][0])
        shape = tuple(image_bgr.shape[:2])
        pred = frame_class_map(logits, shape, letterbox, self.spec.resize or "stretch", self.crop_fraction)
        channels = max(int(logits.shape[0]), 2)
        scores.add(split.truth(sample, shape, channels), pred, channels)

    def nothing_to_compare(self, task):
        if task.get("reference_varies", 1.0) == 0.0:
            return ("the reference gives the same class map on every photograph (random weights, or nothing in them the "
                    "model knows): a check on it could not fail; use trained weights (--weights) or photographs of "
                    "what the model sees (--images)")
        return SemanticEvaluation.nothing_to_compare(self, task)


def _model_classes(adapter, metadata: dict[str, str]) -> tuple[dict[int, str], int | None]:
    """The model's class names (the graph's or the table's) and count (theirs, or ``--classes``; None: unknown)."""
    names = parse_names(metadata.get("names")) or adapter.default_class_names()
    return names, len(names) if names else adapter.spec.classes


def _maps_vary(maps: np.ndarray) -> bool:
    """Whether class maps change with the image: two photographs give different maps, or one holds 2+ classes."""
    if len(maps) > 1 and any(not np.array_equal(maps[0], m) for m in maps[1:]):
        return True
    return bool(len(maps) == 1 and len(np.unique(maps[0])) > 1)


class TorchClassify(ClassifyEvaluation, TorchModelAdapter):
    task = "classify"
    #: ClassifyEvaluation's gates, and the shift of the reference top-1's probability
    task_gates = {p: {**g, "top1_prob_shift_max": ("<=", {"fp32": 1e-3, "fp16": 0.05}.get(p, 0.15))}
                  for p, g in ClassifyEvaluation.task_gates.items()}

    processor = ClassifyProcessor
    output_parts = TorchModelAdapter.output_parts
    known_parts = TorchModelAdapter.known_parts

    def probabilities(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        """The first output as probabilities (B, nc): softmax of logits."""
        values = outputs[self.output_names[0]].reshape(len(outputs[self.output_names[0]]), -1).astype(np.float64)
        if self.meanings[self.output_names[0]] != "logits":
            return values
        values = values - values.max(1, keepdims=True)
        e = np.exp(values)
        return e / e.sum(1, keepdims=True)

    def task_metrics(self, reference, candidate, metadata, options=None):
        ref, cand = self.probabilities(reference), self.probabilities(candidate)
        result = classify_metrics(ref, cand)
        tops = ref.argmax(1)
        result["reference_varies"] = float(len(np.unique(tops)) > 1 or len(tops) == 1)
        result["reference_top1_classes"] = float(len(np.unique(tops)))
        if _random_weights(metadata) and not result["reference_varies"]:
            result["compared"] = 0.0
        return result

    def read_labels(self, dataset, split: str, metadata: dict[str, str], *, limit: int | None = None,
                    imgsz: int = 640):
        """Ultralytics' class folders, each the model class of its name (``families.torch_models.labels``)."""
        names, count = _model_classes(self, metadata)
        return read_classify_split(dataset, split, names, count, model=self.variant, limit=limit)

    def nothing_to_compare(self, task):
        if task.get("reference_varies", 1.0) == 0.0:
            return ("the random-weight reference gives one top-1 class on every photograph: a check on it could not "
                    "fail; use trained weights (--weights) or more photographs (--images)")
        return ClassifyEvaluation.nothing_to_compare(self, task)


class TorchDepth(DepthEvaluation, TorchModelAdapter):
    task = "depth"
    min_relative_spread = 1e-2
    task_gates = {"fp32": {"abs_rel": ("<=", 1e-3), "delta1": (">=", 0.999)},
                  "fp16": {"abs_rel": ("<=", 0.01), "delta1": (">=", 0.99)},
                  "int8": {"abs_rel": ("<=", 0.05), "delta1": (">=", 0.95)},
                  "fp8": {"abs_rel": ("<=", 0.05), "delta1": (">=", 0.95)}}

    processor = DepthProcessor
    output_parts = TorchModelAdapter.output_parts
    known_parts = TorchModelAdapter.known_parts


class TorchRaw(TorchModelAdapter):
    """Outputs of no declared task: parity per output; no task metrics, no runtime results."""

    task = "raw"
    task_gates: dict = {}
    task_options: dict = {}
    picture_kind = None


TASK_CLASSES = {"semantic": TorchSemantic, "classify": TorchClassify, "depth": TorchDepth, "raw": TorchRaw}
