"""Task-level metrics: does the candidate still detect / estimate depth like the reference?

The reference's own predictions are the ground truth. A check that compares nothing fails:
a random-weight YOLO scores far below the usual 0.25 confidence, so the threshold adapts to
the reference's top scores, and zero reference detections is a failure, not a pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_REFERENCE_DETECTIONS = 20
CONF_THRESHOLD = 0.25
IOU_NMS = 0.7
IOU_MATCH = 0.5


@dataclass
class Detections:
    boxes: np.ndarray  # N x 4, xyxy pixels
    scores: np.ndarray  # N
    classes: np.ndarray  # N (int)


def nms_detections(output: np.ndarray, conf: float, *, end2end: bool = False) -> list[Detections]:
    """Decode a YOLO output batch and apply NMS the way Ultralytics does (its own function)."""
    if end2end:  # (B, max_det, 6): x1 y1 x2 y2 score class, already NMS-free
        return [Detections(o[o[:, 4] >= conf, :4], o[o[:, 4] >= conf, 4], o[o[:, 4] >= conf, 5].astype(int))
                for o in output]
    import torch
    from ultralytics.utils.nms import non_max_suppression

    preds = non_max_suppression(torch.from_numpy(np.ascontiguousarray(output)), conf_thres=conf, iou_thres=IOU_NMS,
                                max_det=300)
    return [Detections(p[:, :4].numpy(), p[:, 4].numpy(), p[:, 5].numpy().astype(int)) for p in preds]


def adaptive_threshold(output: np.ndarray, *, end2end: bool = False) -> float:
    """0.25, or lower so the reference keeps at least MIN_REFERENCE_DETECTIONS per image."""
    if end2end:
        scores = np.sort(output[..., 4], axis=-1)[..., ::-1]
    else:
        scores = np.sort(output[:, 4:, :].max(axis=1), axis=-1)[..., ::-1]
    k = min(MIN_REFERENCE_DETECTIONS, scores.shape[-1]) - 1
    kth = float(scores[:, k].min())
    # half the k-th score: a candidate whose scores shift a little (ONNX Runtime's sigmoid differs
    # from PyTorch's by 2e-4 relative) still keeps its detections
    return min(CONF_THRESHOLD, kth * 0.5)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(br - tl, 0, None).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clip(0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clip(0).prod(-1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def match_detections(ref: Detections, cand: Detections) -> tuple[np.ndarray, int]:
    """Greedy match by descending candidate score: (true-positive flags per candidate, #reference)."""
    order = np.argsort(-cand.scores, kind="stable")
    tp = np.zeros(len(order), dtype=bool)
    used = np.zeros(len(ref.boxes), dtype=bool)
    if len(ref.boxes) and len(order):
        ious = box_iou(cand.boxes[order], ref.boxes)
        for i, ci in enumerate(order):
            same = (ref.classes == cand.classes[ci]) & ~used
            if not same.any():
                continue
            j = int(np.argmax(np.where(same, ious[i], -1.0)))
            if ious[i, j] >= IOU_MATCH:
                tp[i] = True
                used[j] = True
    return tp, len(ref.boxes)


def average_precision(tp: np.ndarray, n_ref: int) -> float:
    """All-point interpolated AP of a ranked true-positive list."""
    if n_ref == 0:
        return float("nan")
    ctp = np.cumsum(tp)
    recall = ctp / n_ref
    precision = ctp / np.arange(1, len(tp) + 1)
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[1.0], precision, [0.0]])
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    idx = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[idx + 1] - mrec[idx]) * mpre[idx + 1]))


def detection_metrics(ref_out: np.ndarray, cand_out: np.ndarray, *, end2end: bool = False) -> dict[str, float]:
    """Precision, recall and mAP50 of the candidate's detections against the reference's."""
    conf = adaptive_threshold(ref_out, end2end=end2end)
    refs = nms_detections(ref_out, conf, end2end=end2end)
    cands = nms_detections(cand_out, conf, end2end=end2end)
    n_ref = sum(len(r.boxes) for r in refs)
    n_cand = sum(len(c.boxes) for c in cands)
    if n_ref == 0:
        return {"reference_detections": 0.0, "candidate_detections": float(n_cand), "precision": 0.0,
                "recall": 0.0, "map50": 0.0, "conf_threshold": conf}
    tps, aps = [], []
    classes = sorted({int(c) for r in refs for c in r.classes})
    per_class_tp: dict[int, list] = {c: [] for c in classes}
    per_class_n: dict[int, int] = {c: 0 for c in classes}
    for ref, cand in zip(refs, cands):
        tp, _ = match_detections(ref, cand)
        tps.append(tp)
        order = np.argsort(-cand.scores, kind="stable")
        for c in classes:
            mask = cand.classes[order] == c
            per_class_tp[c].append(np.stack([cand.scores[order][mask], tp[mask]], axis=1))
            per_class_n[c] += int((ref.classes == c).sum())
    for c in classes:
        rows = np.concatenate(per_class_tp[c]) if per_class_tp[c] else np.zeros((0, 2))
        rows = rows[np.argsort(-rows[:, 0], kind="stable")] if len(rows) else rows
        aps.append(average_precision(rows[:, 1].astype(bool) if len(rows) else np.zeros(0, bool), per_class_n[c]))
    n_tp = int(sum(t.sum() for t in tps))
    return {
        "reference_detections": float(n_ref),
        "candidate_detections": float(n_cand),
        "precision": n_tp / n_cand if n_cand else 0.0,
        "recall": n_tp / n_ref,
        "map50": float(np.nanmean(aps)),
        "conf_threshold": conf,
    }


def align_scale_shift(pred: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Least-squares scale and shift of ``pred`` onto ``ref`` over ``mask``."""
    p, r = pred[mask].astype(np.float64), ref[mask].astype(np.float64)
    a = np.stack([p, np.ones_like(p)], axis=1)
    (scale, shift), *_ = np.linalg.lstsq(a, r, rcond=None)
    return pred * scale + shift


def depth_metrics(ref_out: np.ndarray, cand_out: np.ndarray) -> dict[str, float]:
    """AbsRel and delta<1.25 after least-squares scale and shift, over pixels the reference sees."""
    ref = ref_out.astype(np.float64)
    cand = cand_out.astype(np.float64)
    mask = ref > 1e-3 * max(float(ref.max()), 1e-12)
    if not mask.any() or not np.isfinite(cand).all():
        return {"pixels": float(mask.sum()), "abs_rel": float("inf"), "delta1": 0.0}
    aligned = align_scale_shift(cand, ref, mask)
    r, a = ref[mask], np.maximum(aligned[mask], 1e-12)
    return {
        "pixels": float(mask.sum()),
        "abs_rel": float(np.mean(np.abs(a - r) / r)),
        "delta1": float(np.mean(np.maximum(a / r, r / a) < 1.25)),
    }
