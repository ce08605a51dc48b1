"""Ultralytics YOLO detectors (yolov8*, yolov9*, yolov10*, yolo11*, yolo12*, yolo26*...).

Ultralytics builds, loads and preprocesses; this adapter only prepares its model for export
(fuse, export-mode Detect head) the way Ultralytics' own ONNX export does, and describes it.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np

from enginekit.cache import sha256_file
from enginekit.errors import UsageError
from enginekit.families.base import (
    LoadedModel,
    ModelAdapter,
    OutputPart,
    Tolerance,
    WeightsSource,
    check_weights_file,
    describe_load_error,
    seed_everything,
)
from enginekit.families.registry import FamilyInfo, register
from enginekit.shapes import InputConstraint, Shape

# "yolo12n", "yolov8s", "yolo11x": family token + scale letter. Task variants (-seg, -pose...)
# are families of their own (families/yolo_tasks.py).
NAME_RE = re.compile(r"^(yolov\d+|yolo\d+)([nsmlxtbce])$")

# Whole-output limits (recipes show them; a graph is gated per part, below).
_TOLERANCES = {
    "fp32": Tolerance(rel_l2=1e-5, cosine=0.999999),
    "fp16": Tolerance(rel_l2=2e-2, cosine=0.999),
    "int8": Tolerance(rel_l2=0.25, cosine=0.95),
    "fp8": Tolerance(rel_l2=0.25, cosine=0.95),
}

# Per part: boxes in pixels (xywh, 0..640), scores as probabilities (0..1).
# Measured 2026-11-26, ONNX Runtime CPU (2-core CPU) against PyTorch FP32: yolov8n trained on generated
# coloured shapes (tests/trained_detector.py, 3 classes), 1x3x320x320, 8 held-out shape images
# (49 FP32 detections at conf 0.25) + 1 random input; worst over the 9 inputs:
#   fp32 (simplified): boxes rel L2 1.0e-7;  scores rel L2 1.4e-5, max abs 1.0e-6
#   fp16 (AutoCast):   boxes rel L2 2.6e-4 (max abs 0.51 px), cosine 1 - 3e-8;
#                      scores rel L2 1.4e-3, cosine 1 - 7e-7, max abs 6.0e-4;
#                      task: recall 1, precision 1, score shift max 4.1e-4, mAP50 0.995, mAP50-95 0.995
#   int8 (entropy, 8 shape images, Detect head excluded): boxes rel L2 0.015, cosine 0.99988;
#                      scores rel L2 0.10, cosine 0.9958, max abs 0.17;
#                      task: recall 1, precision 0.98, score shift mean 0.006 / max 0.059, mAP50 0.994
#   yolo12n, random weights, 1x3x256x256, 2 photographs + 1 random: fp16 scores rel L2 2.1e-3 (its
#   scores are ~1e-5, so relative figures are large where absolute ones are 3e-7), fp32 5.3e-4.
# Limits: ~10-20x the fp16 figures, ~2-3x the int8 ones. The class-score shift of the issue (every
# class logit - 1) moves scores by up to 0.13 and fails the fp16 scores gates and the task recall.
_PART_TOLERANCES = {
    "fp32": {"boxes": Tolerance(rel_l2=1e-5, cosine=0.999999),
             "scores": Tolerance(rel_l2=5e-3, cosine=0.9999, max_abs=1e-4)},
    "fp16": {"boxes": Tolerance(rel_l2=5e-3, cosine=0.9999),
             "scores": Tolerance(rel_l2=2e-2, cosine=0.9999, max_abs=0.01)},
    "int8": {"boxes": Tolerance(rel_l2=0.05, cosine=0.999),
             "scores": Tolerance(rel_l2=0.25, cosine=0.98, max_abs=0.35)},
    "fp8": {"boxes": Tolerance(rel_l2=0.05, cosine=0.999),
            "scores": Tolerance(rel_l2=0.25, cosine=0.98, max_abs=0.35)},
}


_END2END_REFUSAL = ("{} ends in a one-to-one head whose outputs are the kept boxes already (no NMS to add): "
                    "export it without --nms")


def _zero_padded(nms_model):
    """Ultralytics' NMSModel with the rows past the kept boxes zeroed: its fixed-size candidate
    path also returns, after them, the candidates it scored 0 (under conf or suppressed), with
    their boxes. Its greedy NMS (``torchvision.ops.nms``, ONNX NonMaxSuppression, which
    TensorRT-RTX cannot build) runs as ``graph_nms.greedy_nms``: the same kept boxes in ordinary
    operators. (Rotated boxes use Ultralytics' own Fast-NMS, already in ordinary operators.)"""
    import torch

    from enginekit.families.graph_nms import torchvision_nms_as_greedy_graph

    class ZeroPadded(torch.nn.Module):
        def __init__(self, nms):
            super().__init__()
            self.nms = nms

        def forward(self, x):
            with torchvision_nms_as_greedy_graph():
                out = self.nms(x)
            if isinstance(out, tuple):  # a segmenter's (kept instances, mask prototypes)
                return (out[0] * (out[0][..., 4:5] > 0), *out[1:])
            return out * (out[..., 4:5] > 0)

    return ZeroPadded(nms_model).eval()


def ultralytics_model_dir() -> Path | None:
    """Ultralytics' model YAML folder, found without importing ultralytics (slow)."""
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "cfg" / "models"


def architecture_yaml(name: str) -> Path | None:
    """The YAML Ultralytics builds ``name`` from: ``yolo12.yaml`` serves every scale of
    yolo12, while some families (yolov9, yolov10) have one file per scale."""
    root = ultralytics_model_dir()
    match = NAME_RE.match(name)
    if root is None or match is None:
        return None
    for stem in (match.group(1), name):
        for path in root.rglob(f"{stem}.yaml"):
            return path
    return None


TASK_SUFFIXES = {"detect": "", "segment": "-seg", "pose": "-pose", "obb": "-obb", "classify": "-cls",
                 "semantic": "-sem", "depth": "-depth"}


def task_mismatch(what, found: str, variant: str, expected: str) -> str:
    """One line: a checkpoint of one task given under the name of another."""
    hint = ""
    if found in TASK_SUFFIXES:
        base = re.sub(r"-(seg|pose|obb|cls|sem|depth)$", "", variant)
        hint = f": use the name {base}{TASK_SUFFIXES[found]}"
    return f"{what} is a {found} checkpoint, but {variant} is a {expected} model{hint}"


def ends_in_own_nms(name: str) -> bool:
    """Whether the architecture ``name`` is built from has a one-to-one head (yolo26's
    ``end2end: True``, yolov10's v10Detect): its outputs are kept boxes already."""
    path = architecture_yaml(name)
    if path is None:
        return False
    text = path.read_text()
    return re.search(r"^end2end:\s*True\b", text, re.M) is not None or "v10Detect" in text


def known_variants() -> list[str]:
    root = ultralytics_model_dir()
    if root is None:
        return []
    names = set()
    for path in root.rglob("yolo*.yaml"):
        if NAME_RE.match(path.stem):  # one file per scale
            names.add(path.stem)
        elif NAME_RE.match(path.stem + "n"):  # one file for every scale
            names.add(path.stem + "{n,s,m,l,x}")
    return sorted(names)


@register
class YoloAdapter(ModelAdapter):
    family = "yolo"
    task = "detect"
    framework = "ultralytics"
    example = "yolo12n"
    picture_kind = "detections"
    input_name = "images"
    output_names = ("output0",)
    default_input = (1, 3, 640, 640)
    # Only batch is dynamic: a fixed H/W keeps the anchor count, and so the graph, static.
    dynamic_axes = {"images": {0: "batch"}, "output0": {0: "batch"}}
    input_description = "NCHW RGB float32 in [0,1], letterboxed with gray 114 (Ultralytics LetterBox)"
    # The Detect head (box/DFL and class branches, their final convolutions) stays out of INT8:
    # quantizing it collapses confidence scores. Detect's branches are ModuleLists (cv2.0,
    # cv3.1, ...), which tells them from the cv1/cv2 convolutions of C2f blocks.
    int8_exclude = (r"/model\.\d+/(one2one_)?cv[23]\.\d+/.*", r"/model\.\d+/(one2one_)?dfl/.*")
    # Calibrated on the 8 embedded photographs, the trained detector's INT8 graph kept, at 320 / 640 px,
    # recall 0.939 / 0.989 with entropy (fails the 5% rule at 320) and 0.980 / 1.000 with max, which
    # also calibrates 5-15x faster (benchmarks/int8_calibration.py). Max is the YOLO default.
    int8_calibration = "max"
    runtime_processor = "enginekit.runtime.yolo:YoloProcessor"

    # Against the FP32 detections at the operating point (conf 0.25): a graph fails when it loses
    # more than 5% of them (recall), adds more than 5% (precision), or ranks them below mAP50 0.9
    # (measured above: fp16 1 / 1 / 0.995, int8 1 / 0.98 / 0.994 on the trained detector). FP32
    # graphs differ from PyTorch by ~1e-6 in score: one flip in 100 detections is already a fault.
    _DEFAULT_TASK = {"recall": (">=", 0.95), "precision": (">=", 0.95), "map50": (">=", 0.9)}
    task_gates = {
        "fp32": {"recall": (">=", 0.99), "precision": (">=", 0.99), "map50": (">=", 0.98)},
        "fp16": dict(_DEFAULT_TASK),
        "int8": dict(_DEFAULT_TASK),
        "fp8": dict(_DEFAULT_TASK),
    }
    # the operating point: Ultralytics predict's default confidence. conf_margin: a detection whose score
    # crosses it by less counts as a threshold flip, not as lost or extra (compare.tasks.detection_metrics);
    # 0 keeps the plain rule, as segment, pose and obb do.
    task_options = {"conf": 0.25, "conf_margin": 0.0}

    def output_parts(self, metadata=None):
        if (metadata or {}).get("end2end") == "True":  # (B, max_det, 6): x1 y1 x2 y2 score class
            return (OutputPart("boxes", "output0", -1, 0, 4, "boxes_xyxy"),
                    OutputPart("scores", "output0", -1, 4, 5, "probabilities"),
                    OutputPart("classes", "output0", -1, 5, 6, "classes"))
        # (B, 4 + nc, anchors): rows 0:4 xywh pixels, rows 4: class probabilities
        return (OutputPart("boxes", "output0", 1, 0, 4, "boxes_xywh"),
                OutputPart("scores", "output0", 1, 4, None, "probabilities"))

    def known_parts(self):
        return ("boxes", "scores", "classes")

    def parity_outputs(self, reference, candidate, metadata):
        if metadata.get("nms") != "True":
            return reference, candidate
        from enginekit.compare.tasks import paired_rows  # kept boxes: compare the ones both kept

        ref, cand = paired_rows(reference["output0"], candidate["output0"], xywh=self.box_kind(True) == "boxes_xywh")
        return {**reference, "output0": ref}, {**candidate, "output0": cand}

    def box_kind(self, end2end: bool) -> str:
        return "boxes_xyxy" if end2end else "boxes_xywh"

    def part_tolerance(self, precision, part):
        per = _PART_TOLERANCES[precision]
        return per.get(part, per["boxes"] if part == "classes" else self.tolerance(precision))

    def task_metrics(self, reference, candidate, metadata, options=None):
        from enginekit.compare.tasks import detection_metrics

        end2end = metadata.get("end2end") == "True"
        options = options or {}
        conf = options.get("conf", self.task_options["conf"])
        margin = options.get("conf_margin", self.task_options["conf_margin"])
        return detection_metrics(reference["output0"], candidate["output0"], end2end=end2end, conf=conf,
                                 margin=margin)

    def picture_boxes(self, outputs, metadata, hw, conf):
        from enginekit.compare.tasks import nms_detections

        return nms_detections(outputs["output0"][:1], conf, end2end=metadata.get("end2end") == "True")[0].boxes

    def nothing_to_compare(self, task):
        return (f"the reference has no detections at conf {task.get('conf', 0.25):g} on the photographs; "
                "use photographs of what the model detects (--images) or a lower conf (--tol conf=...)")

    @classmethod
    def matches(cls, name: str) -> bool:
        return architecture_yaml(name) is not None

    def nms_refusal(self) -> str | None:
        if ends_in_own_nms(self.variant):
            return _END2END_REFUSAL.format(self.variant)
        return None

    def export_module(self, loaded: LoadedModel, batch: int):
        """With ``--nms``: Ultralytics' NMS wrapper, unrolled over ``batch`` images (its trace
        serves batches up to that one; smaller batches are padded, as Ultralytics' export does)."""
        if self.nms is not None:
            loaded.module.nms.args.batch = batch
        return loaded.module

    @classmethod
    def describe(cls) -> FamilyInfo:
        return FamilyInfo(cls.family, cls.task, known_variants(), "1x3x640x640 (dynamic batch)",
                          "Ultralytics .pt checkpoint, or <name>.pt from the Ultralytics hub",
                          "any detector Ultralytics builds by name; heads with a one-to-one branch "
                          "(yolo26, yolov10) export end-to-end (kept boxes, no NMS); the others take --nms "
                          "(Ultralytics' NMS in the graph)", nms=True)

    @property
    def constraint(self) -> InputConstraint:
        return InputConstraint(self.input_name, 3, 32, self.variant)

    def tolerance(self, precision: str) -> Tolerance:
        return _TOLERANCES[precision]

    # -- loading ------------------------------------------------------------------------
    def hub_weights(self) -> Path:
        """The local file ``<variant>.pt`` resolves to (downloaded by Ultralytics if need be):
        its content, not its name, keys every stage of a hub model."""
        from ultralytics.utils.downloads import attempt_download_asset

        hub = f"{self.variant}.pt"
        try:
            path = Path(attempt_download_asset(hub))
        except Exception:  # noqa: BLE001
            path = None
        if path is None or not path.is_file():
            raise UsageError(f"cannot download {hub} (offline?): pass --weights PATH to a local checkpoint, "
                             "or --random-init for structure-only work")
        return path

    def load(self, weights: Path | None, *, random_init: bool, seed: int) -> LoadedModel:
        from ultralytics import YOLO

        if random_init:
            seed_everything(seed)
            tag = f"+{self.random_init_tag}" if self.random_init_tag else ""
            source = WeightsSource("random", f"{self.variant}.yaml{tag}@{seed}")
            try:
                model = YOLO(f"{self.variant}.yaml", task=self.task).model
            except Exception as exc:  # noqa: BLE001 - one line for the user
                raise UsageError(describe_load_error(exc, f"cannot build {self.variant}")) from None
            model = self._random_init(model, seed)
        elif weights is not None:
            from enginekit.families.checkpoints import load_ultralytics_model

            source = check_weights_file(weights)
            try:
                # A pickle: read through the weights_only unpickler and an allowlist of the
                # classes Ultralytics checkpoints are made of, unless the user trusts the file.
                model = load_ultralytics_model(weights)
            except UsageError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise UsageError(
                    describe_load_error(exc, f"cannot load YOLO checkpoint {weights}")
                ) from None
        else:
            hub = f"{self.variant}.pt"
            downloaded = self.hub_weights()
            try:
                model = YOLO(str(downloaded), task=self.task).model
            except Exception as exc:  # noqa: BLE001
                raise UsageError(describe_load_error(exc, f"cannot load {hub} ({downloaded})")) from None
            source = WeightsSource("hub", hub, sha256_file(downloaded))
        if getattr(model, "task", "detect") != self.task:
            raise UsageError(task_mismatch(weights or self.variant, model.task, self.variant, self.task))
        prepared = self._prepare(model)
        if self.nms is None:
            return LoadedModel(prepared, self.variant, source, self._metadata(model))
        return LoadedModel(self._wrap_nms(prepared), self.variant, source, {**self._metadata(model), "end2end": "True"})

    def _random_init(self, model, seed: int):
        """The freshly built seeded model, as ``--random-init`` serves it (as Ultralytics builds it, here)."""
        return model

    def _wrap_nms(self, model):
        """The prepared model inside Ultralytics' ``nms=True`` wrapper (``exporter.NMSModel``):
        one graph from image to kept boxes, (B, max_det, 6) x1 y1 x2 y2 score class, zero-padded."""
        from types import SimpleNamespace

        import torchvision.ops  # noqa: F401 - NMSModel imports it in forward; its import calls an op a trace refuses
        from ultralytics.engine.exporter import NMSModel

        head = model.model[-1]
        if getattr(model, "end2end", False) or getattr(head, "end2end", False):
            raise UsageError(f"--nms: {_END2END_REFUSAL.format(self.variant)}")
        head.xyxy = True  # NMSModel takes corner boxes, as Ultralytics' exporter sets for nms=True
        s = self.nms
        args = SimpleNamespace(format="onnx", dynamic=True, batch=2, conf=s.conf, iou=s.iou, max_det=s.max_det,
                               agnostic_nms=s.agnostic, opset=None)
        wrapper = NMSModel(model, args).eval()
        # Ultralytics' fixed-size candidate path (its TensorFlow one): scores under conf zeroed and
        # the top max_det*5 kept, rather than a boolean mask (NonZero: TensorRT-RTX has no such layer)
        wrapper.is_tf = True
        return _zero_padded(wrapper)

    def _prepare(self, model):
        """Fuse and switch the Detect head to export mode, as Ultralytics' exporter does."""
        from ultralytics.nn.modules import C2f, Detect

        model = model.float().eval()
        for p in model.parameters():
            p.requires_grad = False
        if getattr(model.model[-1], "one2one_cv2", None) is not None:
            model.end2end = True  # a one-to-one head (yolo26, yolov10): kept boxes, no NMS (Ultralytics nms=False)
        model = model.fuse()
        for m in model.modules():
            if isinstance(m, Detect):
                m.dynamic = True
                m.export = True
                m.format = "onnx"
                m.shape = None
            elif isinstance(m, C2f):
                # split() exports to one Split node instead of chunk()'s slices
                m.forward = m.forward_split
        return model

    def _metadata(self, model) -> dict[str, str]:
        head = model.model[-1]
        return {
            "task": self.task,
            "stride": str(int(max(model.stride.tolist()))),
            "names": str(dict(model.names)),
            "end2end": str(bool(getattr(head, "end2end", False))),
        }

    def save_checkpoint(self, loaded: LoadedModel, path: Path) -> None:
        """Write an Ultralytics-format checkpoint (``{"model": ...}`` pickle)."""
        import copy

        import torch

        torch.save({"model": copy.deepcopy(loaded.module), "train_args": {}}, path)

    # -- inputs -------------------------------------------------------------------------
    def preprocess(self, image_rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        from ultralytics.data.augment import LetterBox

        boxed = LetterBox(new_shape=hw, auto=False, scaleup=True, center=True)(image=image_rgb)
        chw = np.ascontiguousarray(boxed.transpose(2, 0, 1), dtype=np.float32) / 255.0
        return chw[None]

    def random_inputs(self, shape: Shape, seed: int) -> np.ndarray:
        return np.random.default_rng(seed).random(shape, dtype=np.float32)
