"""Evaluation by task, for any family: mix in the task's class and declare what differs.

- :class:`InstanceEvaluation` (detect, segment, pose, obb): the family decodes its outputs into
  ``compare.instances.Instances`` in the input's pixels (``decode``) and names their similarity;
  task metrics, the picture's boxes and the wording follow. Decoding is kept apart from the
  metrics, so the reference side could as well be labels.
- :class:`ClassifyEvaluation`, :class:`SemanticEvaluation`, :class:`DepthEvaluation`: the family's
  first output is probabilities, per-pixel logits or a depth map; metrics from ``compare.task_metrics``.

Gates here are defaults a family may replace with its own measured ones.
"""

from __future__ import annotations

import numpy as np

from enginekit.compare.instances import CONF_MAP, MAX_DET, Instances, Similarity, box_iou, compare_instances
from enginekit.compare.parts import OutputPart
from enginekit.compare.instances import rotated_iou
from enginekit.compare.label_metrics import ClassifyScores, InstanceScores
from enginekit.compare.task_metrics import class_maps, classify_metrics, depth_metrics, semantic_metrics


def instance_gates(metric: str) -> dict[str, dict[str, tuple[str, float]]]:
    """Against the FP32 instances at the operating point: a graph fails when it loses more than 5% of them
    (recall), adds more than 5% (precision), or ranks them below ``metric`` 0.9 (FP32 graphs: 1%, 0.98)."""
    default = {"recall": (">=", 0.95), "precision": (">=", 0.95), metric: (">=", 0.9)}
    return {"fp32": {"recall": (">=", 0.99), "precision": (">=", 0.99), metric: (">=", 0.98)},
            "fp16": dict(default), "int8": dict(default), "fp8": dict(default)}


def label_gates(metric: str) -> dict[str, dict[str, float]]:
    """The most a graph's ``metric`` against labels (``verify --data``) may fall below the FP32 PyTorch model's,
    per precision (``gt.<metric>_drop``): ``LABEL_DROP_LIMITS`` below."""
    return {p: {f"{metric}_drop": v} for p, v in LABEL_DROP_LIMITS.items()}


# Loss against labels, per precision (verify --data; figures in the README's "Against labels"). FP32 graphs
# score as their PyTorch model to 1e-5 on ONNX Runtime CPU (yolov8s, 200 images: drop 0.0000), so 0.002 leaves
# room for a backend's other kernels only. FP16 and INT8 take the loss users accept in published PTQ tables
# (YOLOv8n: mAP50-95 0.37 FP16 against 0.33 INT8 is a drop of 0.04 a tuned INT8 must beat): 0.01 and 0.03,
# to be narrowed by measurement on trained detectors (benchmarks/labels.py).
LABEL_DROP_LIMITS = {"fp32": 0.002, "fp16": 0.01, "int8": 0.03, "fp8": 0.03}


class InstanceEvaluation:
    """Tasks whose outputs are instances: boxes (detect), masks (segment), keypoints (pose), rotated boxes (obb)."""

    #: the operating point (Ultralytics predict's default confidence) and the threshold-flip margin
    #: (``compare.instances.instance_metrics``; 0 keeps the plain rule)
    task_options = {"conf": 0.25, "conf_margin": None}  # None: the band measured (compare.instances)
    task_gates = instance_gates("map50")
    #: against labels (verify --data): the loss of the task's own mAP50-95 (``mask_``, ``pose_`` for those tasks)
    label_gates = label_gates("map50_95")
    picture_kind = "detections"
    #: the similarity's mAP names (``mask_map50``, ``pose_map50``); "" for boxes
    metric_prefix = ""
    #: the boxes' mAP50 beside the similarity's (segment, pose)
    box_map50 = False
    #: instances per image in the ranked list mAP is computed over
    ranked_max_det = MAX_DET
    #: what the instances are, for the "nothing to compare" line
    instances_name = "detections"
    #: what photographs to use instead, for the same line
    photographs_of = "what the model detects"

    def decode(self, outputs: dict[str, np.ndarray], metadata: dict[str, str], conf: float, *,
               hw: tuple[int, int] | None = None, max_det: int = MAX_DET) -> list[Instances]:
        """Each image's instances scoring above ``conf`` (at most ``max_det``), in the input's pixels
        (``hw``: the input's H x W, for outputs in other units)."""
        raise NotImplementedError

    def similarity(self, metadata: dict[str, str]) -> Similarity:
        """How two instances are compared (box IoU unless the task has masks, keypoints or angles)."""
        return box_iou

    def decoding_notes(self, refs: list[Instances], cands: list[Instances]) -> dict[str, float]:
        """Figures of the decoding itself, beside the metrics (segment: the masks it left out)."""
        return {}

    def decode_each(self, outputs, metadata: dict[str, str], conf: float, *, max_det: int = MAX_DET,
                    **options) -> list[Instances]:
        """``decode`` of a batch of outputs, or of a list of them (photographs of different input sizes)."""
        if isinstance(outputs, (list, tuple)):
            return [i for o in outputs for i in self.decode(o, metadata, conf, max_det=max_det, **options)]
        return self.decode(outputs, metadata, conf, max_det=max_det, **options)

    def task_metrics(self, reference, candidate, metadata, options=None):
        """``reference``/``candidate``: a batch of outputs, or a list of batches (photographs of different sizes)."""
        options = options or {}
        conf = options.get("conf", self.task_options["conf"])
        margin = options.get("conf_margin", self.task_options.get("conf_margin"))
        metrics, refs, cands = compare_instances(
            lambda outputs, c, max_det: self.decode_each(outputs, metadata, c, max_det=max_det), reference, candidate,
            similarity=self.similarity(metadata), conf=conf, margin=margin, prefix=self.metric_prefix,
            box_map50=self.box_map50, ranked_max_det=self.ranked_max_det,
            intervals=bool(options.get("intervals")))  # the mAP's bootstrap, where a gate is decided on it
        return {**metrics, **self.decoding_notes(refs, cands)}

    def picture_boxes(self, outputs, metadata, hw, conf):
        (first,) = self.decode({k: v[:1] for k, v in outputs.items()}, metadata, conf, hw=hw)
        return first.boxes

    # -- against labels (verify --data): the family reads them (``read_labels``, ``label_truth``) -----------
    #: the lowest score a prediction scored against labels may have: Ultralytics' validator's default
    label_conf = CONF_MAP

    def label_scores(self, names: dict[int, str], metadata: dict[str, str]):
        """Ultralytics' validator metrics of this task (``compare.ground_truth.InstanceScores``)."""
        box = rotated_iou if getattr(self, "rotated", False) else box_iou
        extra = self.similarity(metadata) if self.task in ("segment", "pose") else None
        return InstanceScores(self.task, names, box, extra)

    def add_label_image(self, scores, split, sample, image_bgr, outputs, metadata, letterbox, max_det: int) -> None:
        """One image into ``scores``: its labels in the input's pixels (``letterbox``: the runtime's for it)
        against the predictions decoded as Ultralytics' validator decodes them (down to conf 0.001, multi-label)."""
        truth = self.label_truth(split, sample, image_bgr, letterbox)
        (pred,) = self.decode(outputs, metadata, self.label_conf, max_det=max_det, validator=True)
        scores.add(truth, pred, sample.path.name)

    def nothing_to_compare(self, task):
        return (f"the reference has no {self.instances_name} at conf {task.get('conf', 0.25):g} on the photographs; "
                f"use photographs of {self.photographs_of} (--images) or a lower conf (--tol conf=...)")


class ClassifyEvaluation:
    """Class probabilities (B, nc) in the first output: top-1 agreement and top-5 overlap."""

    task_options: dict[str, float] = {}  # no confidence threshold: top-1 and top-5
    _default = {"top1_agreement": (">=", 0.9), "top5_overlap": (">=", 0.8)}
    task_gates = {"fp32": {"top1_agreement": (">=", 1.0), "top5_overlap": (">=", 0.99)},
                  "fp16": dict(_default), "int8": dict(_default), "fp8": dict(_default)}
    label_gates = label_gates("top1")
    picture_kind = None

    def output_parts(self, metadata=None):
        return (OutputPart("probabilities", self.output_names[0], kind="probabilities"),)

    def task_metrics(self, reference, candidate, metadata, options=None):
        name = self.output_names[0]
        return classify_metrics(reference[name], candidate[name])

    def nothing_to_compare(self, task):
        return "the reference's top-1 class leads its second by less than 1e-3 on every photograph"

    def label_scores(self, names: dict[int, str], metadata: dict[str, str]):
        return ClassifyScores()

    def add_label_image(self, scores, split, sample, image_bgr, outputs, metadata, letterbox, max_det: int) -> None:
        scores.add(sample.class_id, outputs[self.output_names[0]][0])


class SemanticEvaluation:
    """Per-pixel class logits (B, nc, H, W) in the first output: mIoU and pixel accuracy of the class maps."""

    task_options: dict[str, float] = {}  # every pixel counts: no confidence threshold
    _default = {"miou": (">=", 0.9), "pixel_accuracy": (">=", 0.95)}
    task_gates = {"fp32": {"miou": (">=", 0.99), "pixel_accuracy": (">=", 0.999)},
                  "fp16": dict(_default), "int8": dict(_default), "fp8": dict(_default)}
    picture_kind = "semantic"

    def output_parts(self, metadata=None):
        return (OutputPart("logits", self.output_names[0], kind="values"),)

    def task_metrics(self, reference, candidate, metadata, options=None):
        name = self.output_names[0]
        return semantic_metrics(reference[name], candidate[name])

    def picture_map(self, outputs, metadata):
        return class_maps(outputs[self.output_names[0]][:1])[0]

    def nothing_to_compare(self, task):
        # random weights: one class everywhere, whatever the image
        return ("the reference class map holds a single class on every photograph; use photographs of what the "
                "model sees (--images), or trained weights")


class DepthEvaluation:
    """A depth map in the first output ((B, H, W) or (B, 1, H, W)): AbsRel and delta1 after scale and shift."""

    task_options: dict[str, float] = {}
    picture_kind = "depth"
    #: a reference whose relative spread is below this is a constant map: nothing to compare (0: not checked)
    min_relative_spread = 0.0

    def output_parts(self, metadata=None):
        return (OutputPart("depth", self.output_names[0], kind="depth"),)

    def depth_maps(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        """The depth maps (B, H, W)."""
        depth = outputs[self.output_names[0]]
        return depth[:, 0] if depth.ndim == 4 else depth

    def task_metrics(self, reference, candidate, metadata, options=None):
        result = depth_metrics(self.depth_maps(reference), self.depth_maps(candidate))
        if result.get("relative_spread", 1.0) < self.min_relative_spread:  # a constant map: nothing to compare
            result["compared"] = 0.0
        return result

    def picture_map(self, outputs, metadata):
        return self.depth_maps(outputs)[0]

    def nothing_to_compare(self, task):
        if not self.min_relative_spread:
            return "the reference depth has no pixels above 1e-3 of its maximum"
        return (f"the reference depth is flat (relative spread {task.get('relative_spread', 0.0):.2g} < "
                f"{self.min_relative_spread:g}) or has no pixels above 1e-3 of its maximum; use photographs of what "
                "the model sees (--images), or trained weights")
