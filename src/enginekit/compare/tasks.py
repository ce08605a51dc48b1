"""Task-level metrics: does the candidate still detect / estimate depth like the reference?

The FP32 reference's own predictions are the ground truth.

Detection, as users know it:
- at the operating point (confidence 0.25 by default, as Ultralytics' predict; ``conf=`` sets it):
  the candidate's detections matched to the reference's (same class, IoU >= 0.5, greedy by
  descending score as Ultralytics' validator matches): recall (share of the reference's
  detections kept), precision (share of the candidate's that the reference has), and the shift
  of matched scores;
- across thresholds: mAP50 and mAP50-95 by Ultralytics' own metric code (its validator's
  matching, ``ultralytics.utils.metrics.DetMetrics``), candidate detections down to its
  validator's confidence 0.001 ranked against the reference's detections at the operating point.

A check that compares nothing fails: a random-weight YOLO scores far below 0.25, so its reference
has no detections; ``compared`` is then 0 and the gate says so instead of passing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONF_THRESHOLD = 0.25  # Ultralytics predict's default
CONF_MAP = 0.001  # Ultralytics val's default: the ranked list mAP is computed over
IOU_NMS = 0.7  # Ultralytics predict/val default
IOU_MATCH = 0.5
MAX_DET = 300


@dataclass
class Detections:
    boxes: np.ndarray  # N x 4, xyxy pixels
    scores: np.ndarray  # N
    classes: np.ndarray  # N (int)

    def __len__(self) -> int:
        return len(self.scores)


def nms_detections(output: np.ndarray, conf: float, *, end2end: bool = False) -> list[Detections]:
    """Decode a YOLO output batch and apply NMS the way Ultralytics does (its own function)."""
    if end2end:  # (B, max_det, 6): x1 y1 x2 y2 score class, already NMS-free
        return [Detections(o[o[:, 4] >= conf, :4], o[o[:, 4] >= conf, 4], o[o[:, 4] >= conf, 5].astype(int))
                for o in output]
    import torch
    from ultralytics.utils.nms import non_max_suppression

    # no time limit: Ultralytics' NMS stops after 2 s + 0.05 s per image, which on a busy machine
    # would drop detections and make a verdict depend on the load
    preds = non_max_suppression(torch.from_numpy(np.ascontiguousarray(output, dtype=np.float32)), conf_thres=conf,
                                iou_thres=IOU_NMS, max_det=MAX_DET, max_time_img=1e6)
    return [Detections(p[:, :4].numpy(), p[:, 4].numpy(), p[:, 5].numpy().astype(int)) for p in preds]


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of xyxy boxes (len(a) x len(b)), by Ultralytics' ``box_iou``."""
    import torch
    from ultralytics.utils.metrics import box_iou as ul_box_iou

    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    return ul_box_iou(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)).numpy()


def match_detections(ref: Detections, cand: Detections, iou: float = IOU_MATCH) -> list[tuple[int, int]]:
    """(candidate index, reference index) pairs: by descending candidate score, each takes the
    unclaimed reference detection of its class with the highest IoU, if that IoU >= ``iou``."""
    order = np.argsort(-cand.scores, kind="stable")
    pairs: list[tuple[int, int]] = []
    if not len(ref) or not len(cand):
        return pairs
    ious = box_iou(cand.boxes, ref.boxes)
    used = np.zeros(len(ref), dtype=bool)
    for ci in order:
        candidates = np.where((ref.classes == cand.classes[ci]) & ~used, ious[ci], -1.0)
        j = int(np.argmax(candidates))
        if candidates[j] >= iou:
            used[j] = True
            pairs.append((int(ci), j))
    return pairs


def paired_rows(ref_out: np.ndarray, cand_out: np.ndarray, *, xywh: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Kept-box outputs (B, max_det, 6+) with the rows the two share side by side.

    An NMS graph's rows are its kept boxes by descending score, zero-padded: two near-equal
    scores swapped, or one box above the threshold in one and not the other, shifts every row
    after it. Per image, each reference row is paired with the candidate row ``match_detections``
    gives it (same class, IoU >= 0.5); pairs come first, in the reference's order, the rest are
    zero in both. Parity then measures the boxes both kept; recall and precision count the others.
    ``xywh``: the rows' boxes are centre and size (rotated boxes' upright extent pairs them; RT-DETR's
    top-k rows, in query order, which near-equal scores reorder the same way)."""
    ref_aligned, cand_aligned = np.zeros_like(ref_out), np.zeros_like(cand_out)

    def corners(b):
        return np.concatenate([b[:, :2] - b[:, 2:4] / 2, b[:, :2] + b[:, 2:4] / 2], 1) if xywh else b[:, :4]

    for b, (ref, cand) in enumerate(zip(ref_out, cand_out)):
        r_rows, c_rows = np.flatnonzero(ref[:, 4] > 0), np.flatnonzero(cand[:, 4] > 0)
        as_detections = lambda rows, o: Detections(corners(o[rows]), o[rows, 4], o[rows, 5].astype(int))  # noqa: E731
        pairs = sorted(match_detections(as_detections(r_rows, ref), as_detections(c_rows, cand)), key=lambda p: p[1])
        for k, (ci, ri) in enumerate(pairs):
            ref_aligned[b, k], cand_aligned[b, k] = ref[r_rows[ri]], cand[c_rows[ci]]
    return ref_aligned, cand_aligned


def _ultralytics_map(refs: list[Detections], cands: list[Detections]) -> tuple[float, float]:
    """mAP50 and mAP50-95 of ranked candidate detections against the reference's, computed by
    Ultralytics' validator matching and ``DetMetrics`` (reference detections as ground truth)."""
    import torch
    from ultralytics.engine.validator import BaseValidator
    from ultralytics.utils.metrics import DetMetrics

    iouv = torch.linspace(0.5, 0.95, 10)
    matcher = type("Matcher", (), {"iouv": iouv})()
    classes = sorted({int(c) for r in refs for c in r.classes} | {int(c) for d in cands for c in d.classes})
    metrics = DetMetrics(names={c: str(c) for c in range(max(classes, default=0) + 1)})
    for i, (ref, cand) in enumerate(zip(refs, cands)):
        order = np.argsort(-cand.scores, kind="stable")
        boxes, scores, pred_cls = cand.boxes[order], cand.scores[order], cand.classes[order]
        if len(ref) and len(cand):
            iou = torch.from_numpy(box_iou(ref.boxes, boxes))
            tp = BaseValidator.match_predictions(matcher, torch.from_numpy(pred_cls), torch.from_numpy(ref.classes),
                                                 iou).numpy()
        else:
            tp = np.zeros((len(cand), len(iouv)), dtype=bool)
        metrics.update_stats({"tp": tp, "conf": scores, "pred_cls": pred_cls, "target_cls": ref.classes,
                              "target_img": np.unique(ref.classes), "im_name": f"image{i}"})
    metrics.process(plot=False)
    return float(metrics.box.map50), float(metrics.box.map)


def detection_metrics(ref_out: np.ndarray, cand_out: np.ndarray, *, end2end: bool = False,
                      conf: float = CONF_THRESHOLD) -> dict[str, float]:
    """The candidate's detections against the reference's, at ``conf`` and across thresholds."""
    refs = nms_detections(ref_out, conf, end2end=end2end)
    cands = nms_detections(cand_out, conf, end2end=end2end)
    n_ref = sum(len(r) for r in refs)
    n_cand = sum(len(c) for c in cands)
    result = {"conf": conf, "compared": float(n_ref), "reference_detections": float(n_ref),
              "candidate_detections": float(n_cand)}
    if n_ref == 0:  # nothing to compare: every figure would be vacuous
        return {**result, "matched": 0.0, "recall": 0.0, "precision": 0.0, "score_shift_mean": float("nan"),
                "score_shift_max": float("nan"), "map50": 0.0, "map50_95": 0.0}
    shifts: list[float] = []
    for ref, cand in zip(refs, cands):
        for ci, ri in match_detections(ref, cand):
            shifts.append(abs(float(cand.scores[ci]) - float(ref.scores[ri])))
    matched = len(shifts)
    ranked = nms_detections(cand_out, min(CONF_MAP, conf), end2end=end2end)
    map50, map50_95 = _ultralytics_map(refs, ranked)
    return {
        **result,
        "matched": float(matched),
        "recall": matched / n_ref,
        "precision": matched / n_cand if n_cand else 0.0,
        "score_shift_mean": float(np.mean(shifts)) if shifts else float("nan"),
        "score_shift_max": float(np.max(shifts)) if shifts else float("nan"),
        "map50": map50,
        "map50_95": map50_95,
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
    spread = float(ref[mask].std() / max(abs(ref[mask].mean()), 1e-12)) if mask.any() else 0.0
    if not mask.any() or not np.isfinite(cand).all():
        return {"compared": float(mask.sum()), "pixels": float(mask.sum()), "relative_spread": spread,
                "abs_rel": float("inf"), "delta1": 0.0}
    aligned = align_scale_shift(cand, ref, mask)
    r, a = ref[mask], np.maximum(aligned[mask], 1e-12)
    return {
        "compared": float(mask.sum()),
        "pixels": float(mask.sum()),
        "relative_spread": spread,  # a constant depth map (nothing to compare) has 0
        "abs_rel": float(np.mean(np.abs(a - r) / r)),
        "delta1": float(np.mean(np.maximum(a / r, r / a) < 1.25)),
    }
