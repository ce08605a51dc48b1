"""Task metrics of every Ultralytics task, the FP32 reference's predictions as ground truth.

Each task is decoded as Ultralytics decodes it (its NMS, ``process_mask``) and compared with
Ultralytics' own metric code where it exists:

- instances (segment, pose, obb, RT-DETR): at the operating point (confidence 0.25 by default)
  the candidate's instances matched to the reference's (same class, similarity >= 0.5, greedy by
  descending score): recall, precision and the shift of matched scores; across thresholds
  mAP50 and mAP50-95 by ``ap_per_class`` over the validator's matching (``match_predictions``),
  candidate instances down to confidence 0.001 ranked against the reference's at the operating
  point. The similarity is the task's: mask IoU of decoded masks (``mask_iou``, masks at the
  prototypes' resolution, 1/4 of the input, as the validator's ``mask_ratio`` 4), OKS of
  keypoints (``kpt_iou`` with COCO sigmas, area = 0.53 x box area as the pose validator),
  probiou of rotated boxes (``batch_probiou``), box IoU (``box_iou``). With a margin (the task
  option ``conf_margin``, 0 by default) a score that crosses the operating point by less than it
  is a threshold flip (``threshold_flips``), neither a lost nor an extra instance;
- classify: top-1 agreement and top-5 overlap (``ClassifyMetrics`` gives top-5 accuracy);
- semantic: mIoU and pixel accuracy of the candidate's class map (``SemanticMetrics``);
- depth: ``compare.tasks.depth_metrics``.

``compared`` counts what the reference offers (instances at the operating point, images, classes
present): 0 means the figures say nothing, and the gate fails instead of passing.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

CONF = 0.25  # Ultralytics predict's default
CONF_MAP = 0.001  # Ultralytics val's default: the ranked list mAP is computed over
IOU_NMS = 0.7
IOU_MATCH = 0.5
MAX_DET = 300
MAX_DET_MAP = 100
MIN_TOP1_MARGIN = 1e-3  # classify: a reference top-1 ahead of its second by less says nothing
MIN_DEPTH_SPREAD = 1e-2  # depth: a reference whose relative spread is below this is a constant  # ranked instances per image for mAP (masks are decoded for each)

Rows = np.ndarray  # one image's kept instances: (N, 6 + extra): box(4), score, class, task channels
Similarity = Callable[[int, Rows, Rows], np.ndarray]  # (image, reference rows, candidate rows) -> (Nref, Ncand)


def decode(output: np.ndarray, conf: float, *, nc: int = 0, end2end: bool = False, rotated: bool = False,
           max_det: int = MAX_DET) -> list[Rows]:
    """Kept instances per image, by Ultralytics' NMS (or its end-to-end filter).

    Rows are [x1, y1, x2, y2 (xywh for rotated), score, class, task channels (angle last for obb)]."""
    import torch
    from ultralytics.utils.nms import non_max_suppression

    preds = non_max_suppression(torch.from_numpy(np.ascontiguousarray(output, dtype=np.float32)), conf_thres=conf,
                                iou_thres=IOU_NMS, max_det=max_det, nc=0 if end2end else nc, rotated=rotated,
                                end2end=end2end, max_time_img=60.0)
    return [p.numpy() for p in preds]


def _greedy(sim: np.ndarray, ref_cls: np.ndarray, cand: Rows, thr: float = IOU_MATCH) -> list[tuple[int, int]]:
    """(candidate, reference) pairs: by descending candidate score, the unclaimed reference instance of
    the same class with the highest similarity, if it reaches ``thr``."""
    pairs: list[tuple[int, int]] = []
    if not sim.size:
        return pairs
    used = np.zeros(sim.shape[0], dtype=bool)
    for ci in np.argsort(-cand[:, 4], kind="stable"):
        options = np.where((ref_cls == cand[ci, 5]) & ~used, sim[:, ci], -1.0)
        j = int(np.argmax(options))
        if options[j] >= thr:
            used[j] = True
            pairs.append((int(ci), j))
    return pairs


def _ultralytics_ap(refs: list[Rows], ranked: list[Rows], similarity: Similarity,
                    truth: list[np.ndarray] | None = None) -> tuple[float, float]:
    """mAP50 and mAP50-95 by Ultralytics' validator matching and ``ap_per_class``.

    ``truth``: per image, which of ``refs`` are ground truth; the others are "difficult" as in
    PASCAL VOC: a ranked instance whose best match (same class, similarity >= 0.5) is one of them
    counts neither as a hit nor as a false positive, and they are not counted as missed."""
    import torch
    from ultralytics.engine.validator import BaseValidator
    from ultralytics.utils.metrics import ap_per_class

    iouv = torch.linspace(0.5, 0.95, 10)
    matcher = type("Matcher", (), {"iouv": iouv})()
    tps, confs, pred_cls, target_cls = [], [], [], []
    for i, (ref, cand) in enumerate(zip(refs, ranked)):
        real = truth[i] if truth is not None else np.ones(len(ref), dtype=bool)
        if len(ref) and len(cand):
            sim = np.asarray(similarity(i, ref, cand), dtype=np.float32)
            if not real.all():
                best = np.where(ref[:, 5][:, None] == cand[:, 5][None], sim, -1.0)
                near = best.argmax(0)
                keep = ~((best.max(0) >= IOU_MATCH) & ~real[near])
                sim, cand = sim[:, keep], cand[keep]
            ref, sim = ref[real], sim[real]
            tp = BaseValidator.match_predictions(matcher, torch.from_numpy(cand[:, 5]), torch.from_numpy(ref[:, 5]),
                                                 torch.from_numpy(sim)).numpy()
        else:
            ref = ref[real]
            tp = np.zeros((len(cand), len(iouv)), dtype=bool)
        tps.append(tp)
        confs.append(cand[:, 4])
        pred_cls.append(cand[:, 5])
        target_cls.append(ref[:, 5])
    tp, conf = np.concatenate(tps), np.concatenate(confs)
    if not len(tp):
        return 0.0, 0.0
    ap = ap_per_class(tp, conf, np.concatenate(pred_cls), np.concatenate(target_cls))[5]
    return float(ap[:, 0].mean()), float(ap.mean())


def instance_metrics(refs: list[Rows], cands: list[Rows], ranked: list[Rows], similarity: Similarity, *,
                     conf: float, margin: float = 0.0, prefix: str = "") -> dict[str, float]:
    """Recall/precision at the operating point and Ultralytics mAP, for any instance similarity.

    ``refs`` and ``cands`` hold the instances scoring ``conf - margin`` or more. An instance of the
    reference at ``conf`` counts as kept when the candidate scores it ``conf - margin`` or more, and
    a candidate's instance at ``conf`` as correct when the reference scored it ``conf - margin`` or
    more: a score that crosses the threshold by less than the margin is a threshold flip (counted in
    ``threshold_flips``), not a lost or an extra instance. For mAP, reference instances between
    ``conf - margin`` and ``conf`` are "difficult" (``_ultralytics_ap``). ``margin`` 0: the plain rule."""
    truth = [r[:, 4] >= conf for r in refs]
    kept = [c[:, 4] >= conf for c in cands]
    n_ref = int(sum(t.sum() for t in truth))
    n_cand = int(sum(k.sum() for k in kept))
    out = {"conf": conf, **({"conf_margin": margin} if margin else {}), "compared": float(n_ref), "reference_detections": float(n_ref),
           "candidate_detections": float(n_cand)}
    if n_ref == 0:
        return {**out, "matched": 0.0, "recall": 0.0, "precision": 0.0, f"{prefix}map50": 0.0,
                f"{prefix}map50_95": 0.0, f"{prefix}similarity_mean": float("nan"), "score_shift_max": float("nan")}
    shifts, sims = [], []
    recalled = correct = flips = 0
    for i, (ref, cand) in enumerate(zip(refs, cands)):
        if not len(ref) or not len(cand):
            continue
        sim = np.asarray(similarity(i, ref, cand))
        for ci, ri in _greedy(sim, ref[:, 5], cand):
            recalled += int(truth[i][ri])
            correct += int(kept[i][ci])
            if truth[i][ri] and kept[i][ci]:
                shifts.append(abs(float(cand[ci, 4]) - float(ref[ri, 4])))
                sims.append(float(sim[ri, ci]))
            elif truth[i][ri] or kept[i][ci]:
                flips += 1
    map50, map50_95 = _ultralytics_ap(refs, ranked, similarity, truth)
    return {**out, "matched": float(len(shifts)), "recall": recalled / n_ref,
            "precision": correct / n_cand if n_cand else 0.0, **({"threshold_flips": float(flips)} if margin else {}),
            f"{prefix}map50": map50, f"{prefix}map50_95": map50_95,
            f"{prefix}similarity_mean": float(np.mean(sims)) if sims else float("nan"),
            "score_shift_max": float(np.max(shifts)) if shifts else float("nan")}


def _box_iou(_: int, ref: Rows, cand: Rows) -> np.ndarray:
    import torch
    from ultralytics.utils.metrics import box_iou

    return box_iou(torch.from_numpy(ref[:, :4]), torch.from_numpy(cand[:, :4])).numpy()


# -- segment -------------------------------------------------------------------------------
def _masks(proto: np.ndarray, rows: Rows, nm: int) -> "np.ndarray":
    """Binary masks (N, mh, mw) at the prototypes' resolution, by Ultralytics' ``process_mask``."""
    import torch
    from ultralytics.utils.ops import process_mask

    if not len(rows):
        return np.zeros((0, *proto.shape[1:]), dtype=np.float32)
    mh, mw = proto.shape[1:]  # 1/4 of the input: the prototypes upsample stride-8 features twice
    masks = process_mask(torch.from_numpy(proto), torch.from_numpy(np.ascontiguousarray(rows[:, 6:6 + nm])),
                         torch.from_numpy(np.ascontiguousarray(rows[:, :4])), (mh * 4, mw * 4))
    # Ultralytics 8.4 binarizes to uint8: mask_iou's matmul of uint8 masks counts their intersection modulo 256
    # (a 610-pixel mask's IoU with itself came out 0.09), so IoU is taken over float masks
    return masks.numpy().astype(np.float32)


def segment_metrics(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], *, nc: int,
                    end2end: bool = False, conf: float = CONF, margin: float = 0.0) -> dict[str, float]:
    """Instance masks: mask IoU of the decoded masks, mask mAP50/mAP50-95, box mAP50.

    An instance whose decoded mask is empty (no pixel inside its box) has nothing to compare by
    mask IoU: such instances are left out on both sides and counted (``empty_masks_*``)."""
    import torch
    from ultralytics.utils.metrics import mask_iou

    ref0, ref1, cand0, cand1 = reference["output0"], reference["output1"], candidate["output0"], candidate["output1"]
    nm = ref1.shape[1]

    def with_masks(rows_per_image: list[Rows], protos: np.ndarray) -> tuple[list[Rows], list[np.ndarray], int]:
        kept_rows, kept_masks, empty = [], [], 0
        for i, rows in enumerate(rows_per_image):
            masks = _masks(protos[i], rows, nm)
            keep = masks.reshape(len(rows), -1).any(1) if len(rows) else np.zeros(0, dtype=bool)
            empty += int((~keep).sum())
            kept_rows.append(rows[keep])
            kept_masks.append(masks[keep].reshape(int(keep.sum()), int(np.prod(masks.shape[1:]))))
        return kept_rows, kept_masks, empty

    low = max(conf - margin, CONF_MAP)
    refs, ref_masks, ref_empty = with_masks(decode(ref0, low, nc=nc, end2end=end2end), ref1)
    cands, cand_masks, cand_empty = with_masks(decode(cand0, low, nc=nc, end2end=end2end), cand1)
    ranked, ranked_masks, _ = with_masks(decode(cand0, min(CONF_MAP, conf), nc=nc, end2end=end2end,
                                                max_det=MAX_DET_MAP), cand1)
    masks_of = {id(r): m for r, m in zip(cands + ranked, cand_masks + ranked_masks)}

    def similarity(i: int, ref: Rows, cand: Rows) -> np.ndarray:
        return mask_iou(torch.from_numpy(ref_masks[i]), torch.from_numpy(masks_of[id(cand)])).numpy()

    result = instance_metrics(refs, cands, ranked, similarity, conf=conf, margin=margin, prefix="mask_")
    truth = [r[:, 4] >= conf for r in refs]
    result["box_map50"] = _ultralytics_ap(refs, ranked, _box_iou, truth)[0] if result["compared"] else 0.0
    result["empty_masks_reference"] = float(ref_empty)
    result["empty_masks_candidate"] = float(cand_empty)
    return result


# -- pose ----------------------------------------------------------------------------------
def pose_metrics(ref_out: np.ndarray, cand_out: np.ndarray, *, nc: int, kpt_shape: tuple[int, int],
                 end2end: bool = False, conf: float = CONF, margin: float = 0.0) -> dict[str, float]:
    """Keypoints: OKS-matched recall/precision, pose mAP50/mAP50-95 (OKS), box mAP50."""
    import torch
    from ultralytics.utils.metrics import OKS_SIGMA, kpt_iou

    nk, dims = kpt_shape
    sigma = OKS_SIGMA if nk == 17 else np.ones(nk) / nk
    low = max(conf - margin, CONF_MAP)
    refs = decode(ref_out, low, nc=nc, end2end=end2end)
    cands = decode(cand_out, low, nc=nc, end2end=end2end)
    ranked = decode(cand_out, min(CONF_MAP, conf), nc=nc, end2end=end2end)

    def kpts(rows: Rows) -> torch.Tensor:
        k = torch.from_numpy(np.ascontiguousarray(rows[:, 6:6 + nk * dims])).view(len(rows), nk, dims)
        return k if dims == 3 else torch.cat([k, torch.ones_like(k[..., :1])], -1)

    def similarity(_: int, ref: Rows, cand: Rows) -> np.ndarray:
        area = torch.from_numpy((ref[:, 2] - ref[:, 0]) * (ref[:, 3] - ref[:, 1]) * 0.53)
        return kpt_iou(kpts(ref), kpts(cand), area, sigma).numpy()

    result = instance_metrics(refs, cands, ranked, similarity, conf=conf, margin=margin, prefix="pose_")
    truth = [r[:, 4] >= conf for r in refs]
    result["box_map50"] = _ultralytics_ap(refs, ranked, _box_iou, truth)[0] if result["compared"] else 0.0
    return result


# -- oriented boxes ------------------------------------------------------------------------
def obb_metrics(ref_out: np.ndarray, cand_out: np.ndarray, *, nc: int, end2end: bool = False,
                conf: float = CONF, margin: float = 0.0) -> dict[str, float]:
    """Rotated boxes matched by probiou: recall/precision, mAP50/mAP50-95."""
    import torch
    from ultralytics.utils.metrics import batch_probiou

    low = max(conf - margin, CONF_MAP)
    refs = decode(ref_out, low, nc=nc, end2end=end2end, rotated=True)
    cands = decode(cand_out, low, nc=nc, end2end=end2end, rotated=True)
    ranked = decode(cand_out, min(CONF_MAP, conf), nc=nc, end2end=end2end, rotated=True)

    def rboxes(rows: Rows) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([rows[:, :4], rows[:, -1:]], axis=1))

    def similarity(_: int, ref: Rows, cand: Rows) -> np.ndarray:
        return batch_probiou(rboxes(ref), rboxes(cand)).numpy()

    return instance_metrics(refs, cands, ranked, similarity, conf=conf, margin=margin)


# -- RT-DETR -------------------------------------------------------------------------------
def rtdetr_rows(output: np.ndarray, conf: float) -> list[Rows]:
    """RT-DETR's predictor: rows (cx, cy, w, h in 0..1, score, class), already top-k; keep score >= conf;
    boxes to xyxy (IoU does not change under the per-axis scaling to pixels)."""
    rows = []
    for o in output:
        xy, wh = o[:, :2], o[:, 2:4]
        r = np.concatenate([xy - wh / 2, xy + wh / 2, o[:, 4:6]], axis=1)
        r = r[o[:, 4] >= conf]
        rows.append(r[np.argsort(-r[:, 4], kind="stable")].astype(np.float32))
    return rows


def rtdetr_metrics(ref_out: np.ndarray, cand_out: np.ndarray, *, conf: float = CONF,
                   margin: float = 0.0) -> dict[str, float]:
    low = max(conf - margin, CONF_MAP)
    refs, cands = rtdetr_rows(ref_out, low), rtdetr_rows(cand_out, low)
    ranked = rtdetr_rows(cand_out, min(CONF_MAP, conf))
    return instance_metrics(refs, cands, ranked, _box_iou, conf=conf, margin=margin)


# -- classify ------------------------------------------------------------------------------
def classify_metrics(ref_out: np.ndarray, cand_out: np.ndarray) -> dict[str, float]:
    """Top-1 agreement, top-5 overlap, and Ultralytics' top-5 accuracy (reference top-1 in the candidate's top 5)."""
    import torch
    from ultralytics.utils.metrics import ClassifyMetrics

    n = len(ref_out)
    if n == 0:
        return {"compared": 0.0, "top1_agreement": 0.0, "top5_overlap": 0.0, "top5_accuracy": 0.0}
    k = min(5, ref_out.shape[1])
    ref_top = np.argsort(-ref_out, axis=1, kind="stable")[:, :k]
    cand_top = np.argsort(-cand_out, axis=1, kind="stable")[:, :k]
    metrics = ClassifyMetrics()
    metrics.process([torch.from_numpy(ref_top[:, 0])], [torch.from_numpy(cand_top)])
    sorted_ref = np.sort(ref_out, axis=1)[:, ::-1]
    margins = sorted_ref[:, 0] - sorted_ref[:, 1] if ref_out.shape[1] > 1 else np.ones(n)
    return {
        # images whose reference top-1 stands out (by 1e-3 of probability): on the others top-1 is noise
        "compared": float((margins >= MIN_TOP1_MARGIN).sum()),
        "top1_agreement": float(metrics.top1),
        "top5_accuracy": float(metrics.top5),
        "top5_overlap": float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ref_top, cand_top)])),
        "top1_prob_shift_max": float(np.max(np.abs(cand_out[np.arange(n), ref_top[:, 0]] - sorted_ref[:, 0]))),
        "reference_top1_margin": float(np.mean(margins)),
    }


# -- semantic ------------------------------------------------------------------------------
def class_maps(logits: np.ndarray) -> np.ndarray:
    """Class ids (B, H, W) of per-pixel logits (B, nc, H, W): their argmax, or logit > 0 for one class."""
    return logits.argmax(1) if logits.shape[1] > 1 else (logits[:, 0] > 0).astype(np.int64)


def semantic_metrics(ref_logits: np.ndarray, cand_logits: np.ndarray) -> dict[str, float]:
    """mIoU and pixel accuracy of the candidate's class map against the reference's (``SemanticMetrics``)."""
    import torch
    from ultralytics.utils.metrics import SemanticMetrics

    nc = ref_logits.shape[1]
    ref_map = torch.from_numpy(class_maps(ref_logits))
    cand_map = torch.from_numpy(class_maps(cand_logits))
    present = int(torch.unique(ref_map).numel())
    metrics = SemanticMetrics(names={i: str(i) for i in range(nc)})
    metrics.update_stats(cand_map, ref_map)
    metrics.process()
    return {"compared": float(present if present > 1 else 0), "reference_classes": float(present),
            "miou": float(metrics.miou), "pixel_accuracy": float(metrics.pixel_accuracy)}
