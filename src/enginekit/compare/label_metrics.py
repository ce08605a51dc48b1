"""Predictions against labels, by Ultralytics' validator metric code: the figures users quote (``yolo val``).

Family-agnostic: per image, the labels and the candidate's ranked predictions are ``Instances`` in the same
input pixels (a family decodes its outputs; ``families.ultralytics.labels`` reads labels); each prediction
is matched to the labels as the validators' ``_process_batch`` does (``BaseValidator.match_predictions``
over 10 IoU thresholds 0.5..0.95, same class, with the similarity of the task: box IoU, mask IoU, keypoint
OKS, probiou), and the statistics go into the task's Ultralytics metrics class (``DetMetrics``,
``SegmentMetrics``, ``PoseMetrics``, ``OBBMetrics``; ``ClassifyMetrics`` for top-1/top-5), whose
``process`` computes precision, recall, mAP50 and mAP50-95 (``ap_per_class``) exactly as ``val`` does.

Keys: ``precision``, ``recall``, ``map50``, ``map50_95`` (boxes; obb: rotated boxes), ``mask_*`` (segment),
``pose_*`` (pose), ``top1``/``top5`` (classify); ``images`` and ``instances`` counted. Semantic class maps
(``SemanticScores``): ``miou`` and ``pixel_accuracy`` of a confusion matrix over the labelled pixels.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from enginekit.compare.instances import Instances, Similarity
from enginekit.compare import intervals
from enginekit.compare.intervals import resamples

#: predictions x replicates a bootstrap of one candidate's mAP scores at most (about 5 s on a 2-core CPU), and the
#: fewest replicates it takes
BOOTSTRAP_WORK = 1_000_000
MIN_REPLICATES = 100

#: Ultralytics' metrics class per task, and the prefix of our keys per results_dict suffix
_METRICS = {"detect": "DetMetrics", "segment": "SegmentMetrics", "pose": "PoseMetrics", "obb": "OBBMetrics"}
_EXTRA_STAT = {"segment": "tp_m", "pose": "tp_p"}
_SUFFIX = {"(B)": "", "(M)": "mask_", "(P)": "pose_"}
_NAMES = {"precision": "precision", "recall": "recall", "mAP50": "map50", "mAP50-95": "map50_95"}

#: the metric a drop against the reference is gated on, per task
HEADLINE = {"detect": "map50_95", "obb": "map50_95", "segment": "mask_map50_95", "pose": "pose_map50_95",
            "classify": "top1", "semantic": "miou"}


def _match(pred: Instances, truth: Instances, sim: np.ndarray) -> np.ndarray:
    """The validator's correct-prediction matrix (Npred, 10): ``BaseValidator.match_predictions``."""
    import torch
    from ultralytics.engine.validator import BaseValidator

    iouv = torch.linspace(0.5, 0.95, 10)
    if not len(truth) or not len(pred):
        return np.zeros((len(pred), len(iouv)), dtype=bool)
    matcher = type("Matcher", (), {"iouv": iouv})()
    return BaseValidator.match_predictions(matcher, torch.from_numpy(pred.classes), torch.from_numpy(truth.classes),
                                           torch.from_numpy(np.asarray(sim, dtype=np.float32))).numpy()


class InstanceScores:
    """Accumulates images of one task (labels and ranked predictions) into Ultralytics' metrics class.

    ``box``: the similarity of the boxes (IoU; probiou for rotated boxes); ``extra``: the task's own
    (mask IoU, keypoint OKS), for ``mask_*`` / ``pose_*``."""

    def __init__(self, task: str, names: dict[int, str], box: Similarity, extra: Similarity | None = None):
        from ultralytics.utils import metrics

        if task not in _METRICS:
            raise ValueError(f"no label metrics for task {task!r}")
        self.task = task
        self.metrics = getattr(metrics, _METRICS[task])(names=dict(names))
        self.box, self.extra = box, extra
        self.images = 0
        self.instances = 0
        self.stats: list[dict] = []  # per image, for the bootstrap over images

    def add(self, truth: Instances, pred: Instances, name: str = "") -> None:
        """One image: its labels (``truth``) and the candidate's predictions down to the validator's conf."""
        stat = {"tp": _match(pred, truth, self.box(truth, pred)) if len(truth) and len(pred) else
                np.zeros((len(pred), 10), dtype=bool),
                "conf": pred.scores.astype(np.float32), "pred_cls": pred.classes.astype(np.float32),
                "target_cls": truth.classes.astype(np.float32), "target_img": np.unique(truth.classes).astype(np.float32),
                "im_name": name or str(self.images)}
        key = _EXTRA_STAT.get(self.task)
        if key is not None:
            stat[key] = _match(pred, truth, self.extra(truth, pred)) if len(truth) and len(pred) else \
                np.zeros((len(pred), 10), dtype=bool)
        self.metrics.update_stats(stat)
        self.stats.append(stat)
        self.images += 1
        self.instances += len(truth)

    def replicates(self) -> dict[str, list[float]]:
        """The task's own mAP50-95 and mAP50 (boxes; masks for segment, keypoints for pose) on ``intervals.resamples``
        of the images: what a paired bootstrap of a drop is made of (the same resamples for the reference and a
        candidate)."""
        from ultralytics.utils.metrics import ap_per_class

        key = _EXTRA_STAT.get(self.task, "tp")
        parts = [(s[key], s["conf"], s["pred_cls"], s["target_cls"]) for s in self.stats]
        out: dict[str, list[float]] = {"map50_95": [], "map50": []}
        # fewer replicates where each is long to score (a large split at the validator's conf 0.001): the first rows of
        # the same seeded draw, so a reference and a candidate stay paired on the replicates both have
        predictions = sum(len(p[1]) for p in parts)
        count = min(intervals.REPLICATES, max(MIN_REPLICATES, int(BOOTSTRAP_WORK / max(predictions, 1))))
        for idx in resamples(len(parts), count):
            chosen = [parts[i] for i in idx]
            tp = np.concatenate([c[0] for c in chosen]) if chosen else np.zeros((0, 10), bool)
            ap = ap_per_class(tp, np.concatenate([c[1] for c in chosen]), np.concatenate([c[2] for c in chosen]),
                              np.concatenate([c[3] for c in chosen]))[5] if len(tp) else np.zeros((0, 10))
            out["map50_95"].append(float(ap.mean()) if len(ap) else 0.0)
            out["map50"].append(float(ap[:, 0].mean()) if len(ap) else 0.0)
        prefix = {"segment": "mask_", "pose": "pose_"}.get(self.task, "")
        return {prefix + k: [round(v, 6) for v in values] for k, values in out.items()}

    def result(self) -> dict[str, float]:
        self.metrics.process()
        out: dict[str, float] = {}
        for key, value in self.metrics.results_dict.items():
            if not key.startswith("metrics/"):
                continue
            stem, _, suffix = key[len("metrics/"):].partition("(")
            prefix = _SUFFIX.get("(" + suffix)
            if prefix is not None and stem in _NAMES:
                out[prefix + _NAMES[stem]] = float(value)
        return {**out, "images": float(self.images), "instances": float(self.instances),
                "replicates": self.replicates()}


class ClassifyScores:
    """Top-1 and top-5 accuracy by Ultralytics' ``ClassifyMetrics``."""

    def __init__(self):
        self.targets: list = []
        self.preds: list = []

    def add(self, class_id: int, probabilities: np.ndarray) -> None:
        import torch

        top = np.argsort(-np.asarray(probabilities).reshape(-1), kind="stable")[:5]
        self.preds.append(torch.from_numpy(top.astype(np.int32))[None])
        self.targets.append(torch.tensor([class_id], dtype=torch.int32))

    def result(self) -> dict[str, float]:
        from ultralytics.utils.metrics import ClassifyMetrics

        m = ClassifyMetrics()
        m.process(self.targets, self.preds)
        hits = np.asarray([float(p[0, 0] == t[0]) for p, t in zip(self.preds, self.targets)])
        boot = [float(hits[idx].mean()) if len(idx) else 0.0 for idx in resamples(len(hits))]
        return {"top1": float(m.top1), "top5": float(m.top5), "images": float(len(self.targets)),
                "instances": float(len(self.targets)), "replicates": {"top1": [round(v, 6) for v in boot]}}


class SemanticScores:
    """Class maps against labelled class maps: one confusion matrix over every labelled pixel of every image.

    ``miou``: the mean IoU over the classes present in the labels or the predictions (a class the candidate
    predicts where the labels have none counts, at IoU 0; a class in neither counts for nothing), as VOC's and
    MMSegmentation's mIoU (Ultralytics' ``SemanticMetrics`` averages over the labels' classes only);
    ``pixel_accuracy``: the share of labelled pixels predicted as labelled. Pixels labelled ``IGNORE`` (-1:
    a mask's 255, classes the model has not) are not scored."""

    def __init__(self):
        self.matrix: np.ndarray | None = None
        self.per_image: list[np.ndarray] = []  # for the bootstrap over images
        self.images = 0
        self.pixels = 0

    def add(self, truth: np.ndarray, pred: np.ndarray, classes: int) -> None:
        """One image: its labelled class map and the candidate's, same H x W, in the model's ``classes``."""
        if truth.shape != pred.shape:
            raise ValueError(f"class maps of {truth.shape} and {pred.shape}")
        n = max(int(classes), 2)
        if self.matrix is None:
            self.matrix = np.zeros((n, n), np.int64)
        elif self.matrix.shape[0] != n:
            raise ValueError(f"class maps of {n} classes after {self.matrix.shape[0]}")
        valid = truth >= 0
        t, p = truth[valid].astype(np.int64), pred[valid].astype(np.int64)
        image = np.bincount(t * n + p, minlength=n * n).reshape(n, n)
        self.matrix += image
        self.per_image.append(image)
        self.images += 1
        self.pixels += int(valid.sum())

    @staticmethod
    def _miou(m: np.ndarray) -> float:
        inter = np.diag(m).astype(np.float64)
        union = m.sum(0) + m.sum(1) - inter
        present = union > 0
        return float((inter[present] / union[present]).mean()) if present.any() else 0.0

    def result(self) -> dict[str, float]:
        m = self.matrix if self.matrix is not None else np.zeros((2, 2), np.int64)
        inter = np.diag(m).astype(np.float64)
        union = m.sum(0) + m.sum(1) - inter
        present = union > 0
        total = m.sum()
        stack = np.stack(self.per_image) if self.per_image else np.zeros((0, 2, 2), np.int64)
        boot = [self._miou(stack[idx].sum(0)) if len(idx) else 0.0 for idx in resamples(len(stack))]
        return {"miou": self._miou(m),
                "pixel_accuracy": float(inter.sum() / total) if total else 0.0, "classes": float(present.sum()),
                "images": float(self.images), "instances": float(self.pixels), "pixels": float(self.pixels),
                "replicates": {"miou": [round(v, 6) for v in boot]}}


def drops(reference: dict[str, float], candidate: dict[str, float]) -> dict[str, float]:
    """The candidate's loss against the reference on each figure both have (positive: worse)."""
    skip = {"images", "instances", "rectangles", "pixels", "classes", "replicates"}
    return {f"{k}_drop": float(reference[k] - candidate[k]) for k in reference
            if k in candidate and k not in skip and isinstance(reference[k], (int, float))}


Scorer = Callable[[], "InstanceScores | ClassifyScores | SemanticScores"]
