"""Instance metrics for every task whose outputs are instances: boxes, masks, keypoints, rotated boxes.

Family-agnostic: a family decodes its outputs into :class:`Instances` (one per image, in the input's
pixels) and names a similarity; everything here compares instances with instances, so the reference
side may be another model's decoded outputs (the FP32 reference, as verify does) or labels.

- at the operating point (confidence 0.25 by default, as Ultralytics' predict): the candidate's
  instances matched to the reference's (same class, similarity >= 0.5, greedy by descending
  candidate score, as Ultralytics' validator matches): recall, precision and the shift of matched
  scores. Near the operating point a score may cross it by what the candidate's scores move anyway:
  the band is measured (``score_band``: the 90th percentile of the matched pairs' score shifts, at
  most ``BAND_CAP``) unless the task option ``conf_margin`` gives it (0: the plain rule). A matched
  pair whose two scores both lie within the band of the operating point and fall on either side of
  it is a threshold flip (``threshold_flips``): it decides neither recall nor precision (left out of
  both counts, ``decided_reference`` / ``decided_candidate``, which the share gates' intervals rest
  on), neither a lost nor an extra instance. A score that moved further is judged as it lands;
- across thresholds: mAP50 and mAP50-95 by Ultralytics' own metric code (its validator's matching,
  ``BaseValidator.match_predictions``, and ``ap_per_class``), candidate instances down to its
  validator's confidence 0.001 ranked against the reference's at the operating point.

Similarities are Ultralytics' functions: box IoU (``box_iou``), mask IoU (``mask_iou``), OKS of
keypoints (``kpt_iou`` with COCO sigmas, area = 0.53 x box area as the pose validator), probiou of
rotated boxes (``batch_probiou``).

``compared`` counts the reference's instances at the operating point: 0 means the figures say
nothing, and the gate fails instead of passing (a random-weight YOLO scores far below 0.25).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np

from enginekit.compare.intervals import percentile_interval

CONF = 0.25  # Ultralytics predict's default
CONF_MAP = 0.001  # Ultralytics val's default: the ranked list mAP is computed over
IOU_NMS = 0.7  # Ultralytics predict/val default
IOU_MATCH = 0.5
MAX_DET = 300
#: no time limit for NMS: Ultralytics' default (2 s + 50 ms per image) stops early on a busy machine and
#: would drop instances, making a verdict depend on the load
NO_TIME_LIMIT = 1e6
#: the widest measured band around the operating point (a fifth of Ultralytics' 0.25): scores that move more than
#: this are judged as they land, however much every score moves
BAND_CAP = 0.05
#: the share of matched pairs whose score shift the band covers
BAND_QUANTILE = 0.9


@dataclass
class Instances:
    """One image's instances, in the input's pixels: what a family decodes its outputs to, or labels.

    ``boxes``: (N, 4) corners x1 y1 x2 y2, or (N, 5) rotated boxes (centre x, centre y, width, height,
    angle in radians); ``scores`` (N,) (labels: 1); ``classes`` (N,) int; ``masks`` (N, h, w) where
    the task has masks (at any resolution both sides share); ``keypoints`` (N, K, 3) x, y, visibility.
    ``left_out`` counts instances decoded but not kept (a segment whose mask is empty)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    masks: np.ndarray | None = None
    keypoints: np.ndarray | None = None
    left_out: int = field(default=0, compare=False)

    def __len__(self) -> int:
        return len(self.scores)

    def __getitem__(self, index) -> "Instances":
        """The instances at ``index`` (a boolean mask or indices), every array alike."""
        arrays = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "left_out"}
        return Instances(**{k: (v[index] if v is not None else None) for k, v in arrays.items()})

    @classmethod
    def from_rows(cls, rows: np.ndarray, **extra) -> "Instances":
        """Rows [x1, y1, x2, y2, score, class, ...] as Ultralytics' NMS gives them."""
        return cls(np.ascontiguousarray(rows[:, :4], dtype=np.float32), rows[:, 4].astype(np.float32),
                   rows[:, 5].astype(np.int64), **extra)


Similarity = Callable[[Instances, Instances], np.ndarray]  # (reference, candidate) -> (Nref, Ncand)


# -- similarities ---------------------------------------------------------------------------------------
def box_iou(ref: Instances, cand: Instances) -> np.ndarray:
    """IoU of corner boxes, by Ultralytics' ``box_iou``."""
    import torch
    from ultralytics.utils.metrics import box_iou as ul_box_iou

    if not len(ref) or not len(cand):
        return np.zeros((len(ref), len(cand)), dtype=np.float32)
    return ul_box_iou(torch.as_tensor(ref.boxes[:, :4], dtype=torch.float32),
                      torch.as_tensor(cand.boxes[:, :4], dtype=torch.float32)).numpy()


def mask_iou(ref: Instances, cand: Instances) -> np.ndarray:
    """IoU of binary masks, by Ultralytics' ``mask_iou``."""
    import torch
    from ultralytics.utils.metrics import mask_iou as ul_mask_iou

    flat = [torch.from_numpy(np.ascontiguousarray(i.masks.reshape(len(i), -1), dtype=np.float32)) for i in (ref, cand)]
    return ul_mask_iou(*flat).numpy()


def rotated_iou(ref: Instances, cand: Instances) -> np.ndarray:
    """probiou of rotated boxes (centre, size, angle), by Ultralytics' ``batch_probiou``."""
    import torch
    from ultralytics.utils.metrics import batch_probiou

    return batch_probiou(torch.from_numpy(np.ascontiguousarray(ref.boxes, dtype=np.float32)),
                         torch.from_numpy(np.ascontiguousarray(cand.boxes, dtype=np.float32))).numpy()


def oks_sigmas(keypoints: int) -> np.ndarray:
    """The pose validator's sigmas: COCO's for 17 keypoints, 1/K each otherwise."""
    from ultralytics.utils.metrics import OKS_SIGMA

    return OKS_SIGMA if keypoints == 17 else np.ones(keypoints) / keypoints


def keypoint_oks(sigmas: np.ndarray) -> Similarity:
    """OKS of keypoints (``kpt_iou``), the reference box's area x 0.53 as the object's scale."""

    def similarity(ref: Instances, cand: Instances) -> np.ndarray:
        import torch
        from ultralytics.utils.metrics import kpt_iou

        area = torch.from_numpy((ref.boxes[:, 2] - ref.boxes[:, 0]) * (ref.boxes[:, 3] - ref.boxes[:, 1]) * 0.53)
        kpts = [torch.from_numpy(np.ascontiguousarray(i.keypoints, dtype=np.float32)) for i in (ref, cand)]
        return kpt_iou(*kpts, area, sigmas).numpy()

    return similarity


# -- matching -------------------------------------------------------------------------------------------
def greedy_pairs(sim: np.ndarray, ref: Instances, cand: Instances, thr: float = IOU_MATCH) -> list[tuple[int, int]]:
    """(candidate, reference) pairs: by descending candidate score, the unclaimed reference instance of
    the same class with the highest similarity (``sim``: Nref x Ncand), if it reaches ``thr``."""
    pairs: list[tuple[int, int]] = []
    if not sim.size:
        return pairs
    used = np.zeros(sim.shape[0], dtype=bool)
    for ci in np.argsort(-cand.scores, kind="stable"):
        options = np.where((ref.classes == cand.classes[ci]) & ~used, sim[:, ci], -1.0)
        j = int(np.argmax(options))
        if options[j] >= thr:
            used[j] = True
            pairs.append((int(ci), j))
    return pairs


#: two kept rows are one box (the same detection, its numbers rounded differently) from this IoU on: rounding moves a
#: box by a fraction of a pixel (FP16 at 640: IoU >= 0.98), where two boxes that NMS told apart overlap near its
#: threshold (0.7)
SAME_BOX_IOU = 0.9


def paired_rows(ref_out: np.ndarray, cand_out: np.ndarray, *, xywh: bool = False,
                same_box_iou: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Kept-box outputs (B, max_det, 6+) with the rows the two share side by side.

    An NMS graph's rows are its kept boxes by descending score, zero-padded: two near-equal
    scores swapped, or one box above the threshold in one and not the other, shifts every row
    after it. Per image, each reference row is paired with the candidate row ``greedy_pairs`` gives
    it (same class, box IoU >= 0.5) where the two are one box (IoU >= ``SAME_BOX_IOU``); pairs come first,
    in the reference's order, the rest are zero in both. Parity then measures the boxes both kept; recall,
    precision and mAP count the others, among them an object whose NMS kept another of its overlapping
    boxes (a rounding moves an IoU across NMS's threshold: that pair overlaps about as much as the threshold,
    0.7, and differs in score by what separates two boxes, not by rounding).
    ``xywh``: the rows' boxes are centre and size (rotated boxes' upright extent pairs them; RT-DETR's
    top-k rows, in query order, which near-equal scores reorder the same way).
    ``same_box_iou``: where no suppression ran (RT-DETR's top-k), every pair is one box: 0.5, so a box that
    moved is measured by parity."""
    same = SAME_BOX_IOU if same_box_iou is None else same_box_iou
    ref_aligned, cand_aligned = np.zeros_like(ref_out), np.zeros_like(cand_out)

    def instances(o: np.ndarray) -> tuple[np.ndarray, Instances]:
        rows = np.flatnonzero(o[:, 4] > 0)
        b = o[rows, :4]
        corners = np.concatenate([b[:, :2] - b[:, 2:4] / 2, b[:, :2] + b[:, 2:4] / 2], 1) if xywh else b
        return rows, Instances(corners, o[rows, 4], o[rows, 5].astype(int))

    for b, (ref, cand) in enumerate(zip(ref_out, cand_out)):
        (r_rows, r), (c_rows, c) = instances(ref), instances(cand)
        iou = box_iou(r, c)
        pairs = sorted(((ci, ri) for ci, ri in greedy_pairs(iou, r, c) if iou[ri, ci] >= same),
                       key=lambda p: p[1])
        for k, (ci, ri) in enumerate(pairs):
            ref_aligned[b, k], cand_aligned[b, k] = ref[r_rows[ri]], cand[c_rows[ci]]
    return ref_aligned, cand_aligned


# -- Ultralytics' mAP -----------------------------------------------------------------------------------
#: bootstrap replicates of the agreement mAP50 (each an ``ap_per_class``: about 20 ms on 16 photographs, 2-core CPU)
AGREEMENT_REPLICATES = 100

def ultralytics_ap(refs: list[Instances], ranked: list[Instances], similarity: Similarity,
                   truth: list[np.ndarray] | None = None, *, replicates: bool = False):
    """mAP50 and mAP50-95 of ranked candidate instances against the reference's, by Ultralytics'
    validator matching (``match_predictions``) and ``ap_per_class`` (the reference as ground truth).

    ``truth``: per image, which of ``refs`` are ground truth; the others are "difficult" as in
    PASCAL VOC: a ranked instance whose best match (same class, similarity >= 0.5) is one of them
    counts neither as a hit nor as a false positive, and they are not counted as missed. ``replicates``: also the
    mAP50 on ``intervals.resamples`` of the images (a bootstrap over images: its interval)."""
    import torch
    from ultralytics.engine.validator import BaseValidator
    from ultralytics.utils.metrics import ap_per_class

    iouv = torch.linspace(0.5, 0.95, 10)
    matcher = type("Matcher", (), {"iouv": iouv})()
    tps, confs, pred_cls, target_cls = [], [], [], []
    for i, (ref, cand) in enumerate(zip(refs, ranked)):
        cand = cand[np.argsort(-cand.scores, kind="stable")]
        real = truth[i] if truth is not None else np.ones(len(ref), dtype=bool)
        if len(ref) and len(cand):
            sim = np.asarray(similarity(ref, cand), dtype=np.float32)
            if not real.all():
                best = np.where(ref.classes[:, None] == cand.classes[None], sim, -1.0)
                near = best.argmax(0)
                keep = ~((best.max(0) >= IOU_MATCH) & ~real[near])
                sim, cand = sim[:, keep], cand[keep]
            ref, sim = ref[real], sim[real]
            tp = BaseValidator.match_predictions(matcher, torch.from_numpy(cand.classes), torch.from_numpy(ref.classes),
                                                 torch.from_numpy(sim)).numpy()
        else:
            ref = ref[real]
            tp = np.zeros((len(cand), len(iouv)), dtype=bool)
        tps.append(tp)
        confs.append(cand.scores)
        pred_cls.append(cand.classes)
        target_cls.append(ref.classes)
    def ap_of(index, thresholds: int = 10) -> tuple[float, float]:
        # thresholds=1: the IoU 0.5 column alone (mAP50: all the replicates need; about a third of the time measured)
        tp = np.concatenate([tps[i][:, :thresholds] for i in index]) if len(index) else np.zeros((0, 10), bool)
        if not len(tp):
            return 0.0, 0.0
        ap = ap_per_class(tp, np.concatenate([confs[i] for i in index]), np.concatenate([pred_cls[i] for i in index]),
                          np.concatenate([target_cls[i] for i in index]))[5]
        return (float(ap[:, 0].mean()), float(ap.mean())) if len(ap) else (0.0, 0.0)

    found = ap_of(range(len(tps)))
    if not replicates:
        return found
    from enginekit.compare.intervals import resamples

    return found, [ap_of(idx, 1)[0] for idx in resamples(len(tps), AGREEMENT_REPLICATES)]


# -- the metrics ----------------------------------------------------------------------------------------
def score_band(pairs: list[tuple[float, float]], conf: float) -> float:
    """The band around ``conf`` within which a score may cross it by what the scores move anyway: the
    ``BAND_QUANTILE`` quantile of ``|candidate - reference|`` over matched pairs (reference, candidate scores) of
    which either side reaches ``conf - BAND_CAP``, at most ``BAND_CAP``; 0 where nothing was matched."""
    shifts = [abs(c - r) for r, c in pairs if max(r, c) >= conf - BAND_CAP]
    if not shifts:
        return 0.0
    return float(min(BAND_CAP, np.quantile(np.asarray(shifts, dtype=np.float64), BAND_QUANTILE)))


def instance_metrics(refs: list[Instances], cands: list[Instances], ranked: list[Instances], similarity: Similarity,
                     *, conf: float, margin: float | None = 0.0, prefix: str = "", box_map50: bool = False,
                     intervals: bool = False) -> dict[str, float]:
    """Recall/precision at the operating point and Ultralytics mAP, for any instance similarity.

    ``refs`` and ``cands`` hold the instances scoring ``conf - margin`` or more (``conf - BAND_CAP`` for a measured
    band); ``ranked`` the candidate's down to ``CONF_MAP``. ``margin``: the band around ``conf`` (None: measured,
    ``score_band``; 0: the plain rule). A matched pair whose scores both lie within the band of ``conf``, one at
    ``conf`` or above and the other below, is a threshold flip (``threshold_flips``): left out of recall's count and
    precision's (``decided_reference``, ``decided_candidate``), neither lost nor extra. For mAP, reference instances
    between ``conf - band`` and ``conf`` are "difficult" (``ultralytics_ap``). ``prefix`` names the similarity's mAP
    (``mask_map50``); ``box_map50`` adds the boxes' mAP50 beside it (segment, pose)."""
    truth = [r.scores >= conf for r in refs]
    kept = [c.scores >= conf for c in cands]
    n_ref = int(sum(t.sum() for t in truth))
    n_cand = int(sum(k.sum() for k in kept))
    matched_pairs, sims_of = [], {}
    for i, (ref, cand) in enumerate(zip(refs, cands)):
        if len(ref) and len(cand):
            sim = np.asarray(similarity(ref, cand))
            for ci, ri in greedy_pairs(sim, ref, cand):
                matched_pairs.append((i, ri, ci))
                sims_of[(i, ri, ci)] = float(sim[ri, ci])
    measured = margin is None
    band = score_band([(float(refs[i].scores[ri]), float(cands[i].scores[ci])) for i, ri, ci in matched_pairs],
                      conf) if measured else float(margin)
    out = {"conf": conf, **({"conf_margin": band} if band or measured else {}),
           **({"conf_margin_measured": 1.0} if measured else {}), "compared": float(n_ref),
           "reference_detections": float(n_ref), "candidate_detections": float(n_cand)}
    if n_ref == 0:  # nothing to compare: every figure would be vacuous
        return {**out, "matched": 0.0, "recall": 0.0, "precision": 0.0, f"{prefix}map50": 0.0,
                f"{prefix}map50_95": 0.0, f"{prefix}similarity_mean": float("nan"), "score_shift_mean": float("nan"),
                "score_shift_max": float("nan"), "decided_reference": 0.0, "decided_candidate": float(n_cand),
                **({"box_map50": 0.0} if box_map50 else {})}
    shifts, sims = [], []
    recalled = correct = flips = ref_flips = cand_flips = 0
    for i, ri, ci in matched_pairs:
        r, c = float(refs[i].scores[ri]), float(cands[i].scores[ci])
        t, k = bool(truth[i][ri]), bool(kept[i][ci])
        if t and k:
            recalled += 1
            correct += 1
            shifts.append(abs(c - r))
            sims.append(sims_of[(i, ri, ci)])
        elif (t or k) and abs(r - conf) <= band and abs(c - conf) <= band:
            flips += 1  # crossed the operating point by no more than the scores move: decides neither share
            ref_flips += int(t)
            cand_flips += int(k)
    decided_ref, decided_cand = n_ref - ref_flips, n_cand - cand_flips
    out.update(decided_reference=float(decided_ref), decided_candidate=float(decided_cand))
    # for mAP the reference's instances at the operating point are the truth, those within the band under it
    # "difficult" (neither hit nor miss), those further under it absent (as the plain rule never decodes them)
    refs = [r[r.scores >= conf - band] for r in refs]
    truth = [r.scores >= conf for r in refs]
    if intervals:  # the mAP50's bootstrap over images (``intervals=True``: where its gate is decided on it)
        (map50, map50_95), boot = ultralytics_ap(refs, ranked, similarity, truth, replicates=True)
        low, high = percentile_interval(boot).to_json()
        bounds = {f"{prefix}map50_low": low, f"{prefix}map50_high": high}
    else:
        (map50, map50_95), bounds = ultralytics_ap(refs, ranked, similarity, truth), {}
    result = {**out, "matched": float(len(shifts)), "recall": recalled / decided_ref if decided_ref else 1.0,
              **bounds, "precision": correct / decided_cand if decided_cand else 0.0,
              **({"threshold_flips": float(flips)} if band else {}),
              f"{prefix}map50": map50, f"{prefix}map50_95": map50_95,
              f"{prefix}similarity_mean": float(np.mean(sims)) if sims else float("nan"),
              "score_shift_mean": float(np.mean(shifts)) if shifts else float("nan"),
              "score_shift_max": float(np.max(shifts)) if shifts else float("nan")}
    if box_map50:
        result["box_map50"] = ultralytics_ap(refs, ranked, box_iou, truth)[0]
    return result


Decode = Callable[[dict[str, np.ndarray], float, int], list[Instances]]  # (outputs, conf, max_det) -> per image


def compare_instances(decode: Decode, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], *,
                      similarity: Similarity, conf: float = CONF, margin: float | None = 0.0, prefix: str = "",
                      box_map50: bool = False, ranked_max_det: int = MAX_DET,
                      intervals: bool = False) -> tuple[dict[str, float], list, list]:
    """Decode both sides (at ``conf - margin``, ``conf - BAND_CAP`` where the band is measured, and the candidate's ranked list at ``CONF_MAP`` up to
    ``ranked_max_det`` per image) and compare them: the metrics, and the decoded reference and
    candidate instances (for what a family adds, such as the masks it left out)."""
    low = max(conf - (BAND_CAP if margin is None else margin), CONF_MAP)
    refs, cands = decode(reference, low, MAX_DET), decode(candidate, low, MAX_DET)
    ranked = decode(candidate, min(CONF_MAP, conf), ranked_max_det)
    metrics = instance_metrics(refs, cands, ranked, similarity, conf=conf, margin=margin, prefix=prefix,
                               box_map50=box_map50, intervals=intervals)
    return metrics, refs, cands
