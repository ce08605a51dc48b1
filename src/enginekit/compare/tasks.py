"""Task-level metrics: does the candidate still detect / estimate depth like the reference?

The FP32 reference's own predictions are the ground truth.

Detection, as users know it:
- at the operating point (confidence 0.25 by default, as Ultralytics' predict; ``conf=`` sets it):
  the candidate's detections matched to the reference's (same class, IoU >= 0.5, greedy by
  descending score as Ultralytics' validator matches): recall (share of the reference's
  detections kept), precision (share of the candidate's that the reference has), and the shift
  of matched scores;
- across thresholds: mAP50 and mAP50-95 by Ultralytics' own metric code (its validator's
  matching, ``ap_per_class``, as every instance task: ``task_metrics.instance_metrics``), candidate
  detections down to its validator's confidence 0.001 ranked against the reference's detections at
  the operating point;
- with a margin (the task option ``conf_margin``), a detection whose score crosses the operating point
  by less than it is a threshold flip (``threshold_flips``), neither lost nor extra.

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


def detection_metrics(ref_out: np.ndarray, cand_out: np.ndarray, *, end2end: bool = False,
                      conf: float = CONF_THRESHOLD, margin: float = 0.0) -> dict[str, float]:
    """The candidate's detections against the reference's, at ``conf`` and across thresholds.

    ``margin`` (the task option ``conf_margin``, as segment, pose and obb have it): a detection whose
    score crosses ``conf`` by less than it, on either side, is a threshold flip (``threshold_flips``),
    neither lost nor extra; a reference detection between ``conf - margin`` and ``conf`` is "difficult"
    for mAP. The matching and mAP are the instance tasks' (``task_metrics.instance_metrics``) with box
    IoU; margin 0 is the plain rule."""
    from enginekit.compare.task_metrics import instance_metrics

    def rows(detections: list[Detections]) -> list[np.ndarray]:
        return [np.concatenate([d.boxes, d.scores[:, None], d.classes[:, None]], 1).astype(np.float32)
                if len(d) else np.zeros((0, 6), np.float32) for d in detections]

    def box_similarity(_: int, ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
        return box_iou(ref[:, :4], cand[:, :4])

    low = max(conf - margin, CONF_MAP)
    refs = rows(nms_detections(ref_out, low, end2end=end2end))
    cands = rows(nms_detections(cand_out, low, end2end=end2end))
    ranked = rows(nms_detections(cand_out, min(CONF_MAP, conf), end2end=end2end))
    result = instance_metrics(refs, cands, ranked, box_similarity, conf=conf, margin=margin)
    shifts = _matched_shifts(refs, cands, conf)
    result["score_shift_mean"] = float(np.mean(shifts)) if shifts else float("nan")
    result.pop("similarity_mean", None)
    return result


def _matched_shifts(refs: list[np.ndarray], cands: list[np.ndarray], conf: float) -> list[float]:
    """Score shifts of the detections both sides keep at ``conf``, matched as the gates match them."""
    shifts: list[float] = []
    for ref, cand in zip(refs, cands):
        ref, cand = ref[ref[:, 4] >= conf], cand[cand[:, 4] >= conf]
        a = Detections(ref[:, :4], ref[:, 4], ref[:, 5].astype(int))
        b = Detections(cand[:, :4], cand[:, 4], cand[:, 5].astype(int))
        shifts += [abs(float(b.scores[ci]) - float(a.scores[ri])) for ci, ri in match_detections(a, b)]
    return shifts


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
