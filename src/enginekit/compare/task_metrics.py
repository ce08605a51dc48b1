"""Task metrics of the tasks whose outputs are not instances: classify, semantic, depth.

Any family of these tasks uses them (Ultralytics' YOLO heads, Depth-Anything, any module with such
a head); the reference's outputs are the truth, or labels in the same form. Each is computed with
Ultralytics' own metric code where it exists:

- classify: top-1 agreement and top-5 overlap (``ClassifyMetrics`` gives top-5 accuracy);
- semantic: mIoU and pixel accuracy of the candidate's class map (``SemanticMetrics``);
- depth: AbsRel and delta < 1.25 after least-squares scale and shift, over the pixels the reference sees.

Instances (detect, segment, pose, obb) are compared in ``compare.instances``. ``compared`` counts
what the reference offers (images whose top-1 stands out, classes present, valid pixels): 0 means
the figures say nothing, and the gate fails instead of passing.
"""

from __future__ import annotations

import numpy as np

MIN_TOP1_MARGIN = 1e-3  # classify: a reference top-1 ahead of its second by less says nothing
MIN_DEPTH_SPREAD = 1e-2  # depth: a reference whose relative spread is below this is a constant


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


# -- depth ---------------------------------------------------------------------------------
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
