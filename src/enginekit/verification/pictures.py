"""Pictures that say more than numbers: detection overlays and depth error heatmaps (PNG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def detection_overlay(image_chw: np.ndarray, reference: np.ndarray, candidate: np.ndarray, path: Path,
                      *, end2end: bool = False, conf: float = 0.25) -> Path:
    """Reference boxes in green, candidate boxes in red, on the model's input image (at ``conf``)."""
    import cv2

    from enginekit.compare.tasks import nms_detections

    img = np.ascontiguousarray((np.clip(image_chw, 0, 1) * 255).astype(np.uint8).transpose(1, 2, 0)[:, :, ::-1])
    (ref,), (cand,) = nms_detections(reference, conf, end2end=end2end), nms_detections(candidate, conf, end2end=end2end)
    for boxes, color, thickness in ((ref.boxes, (0, 200, 0), 3), (cand.boxes, (0, 0, 230), 1)):
        for x1, y1, x2, y2 in boxes.astype(int):
            cv2.rectangle(img, (x1, y1), (x2, y2), color, thickness)
    cv2.putText(img, f"reference {len(ref.boxes)} (green) / candidate {len(cand.boxes)} (red)", (8, 20),
                cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255), 1)
    cv2.imwrite(str(path), img)
    return path


def depth_error_heatmap(reference: np.ndarray, candidate: np.ndarray, path: Path) -> Path:
    """Reference depth | candidate depth | relative error (after scale-and-shift alignment)."""
    import cv2

    from enginekit.compare.tasks import align_scale_shift

    ref, cand = reference[0].astype(np.float64), candidate[0].astype(np.float64)
    mask = ref > 1e-3 * max(float(ref.max()), 1e-12)
    aligned = align_scale_shift(cand, ref, mask) if mask.any() else cand
    err = np.where(mask, np.abs(aligned - ref) / np.maximum(ref, 1e-12), 0.0)

    def colour(a: np.ndarray, hi: float) -> np.ndarray:
        scaled = np.clip(a / max(hi, 1e-12), 0, 1)
        return cv2.applyColorMap((scaled * 255).astype(np.uint8), cv2.COLORMAP_INFERNO)

    hi = float(np.percentile(ref, 99)) or 1.0
    err_hi = max(float(np.percentile(err, 99)), 1e-6)
    panel = np.concatenate([colour(ref, hi), colour(aligned, hi), colour(err, err_hi)], axis=1)
    cv2.putText(panel, f"reference | candidate | rel. error (p99 {err_hi:.2g})", (8, 20),
                cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255), 1)
    cv2.imwrite(str(path), panel)
    return path


def draw_pictures(report, refs, entry, cache, adapter, metadata, folder: Path) -> None:
    """One picture per checked ONNX artifact of an engine entry, on the first photograph."""
    from enginekit.compare.gate import onnx_runner

    photo = next((c for c in refs.cases if c.kind == "photo"), None)
    if photo is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    by_name = {f"onnx-{link['stage']}": link for link in entry.manifest.get("chain", []) if "kind" in link}
    for art in report.artifacts:
        if not art.ran or art.kind != "onnx" or art.name not in by_name:
            continue
        link = by_name[art.name]
        got = onnx_runner(cache.lookup(link["kind"], link["key"]).entry.file("model.onnx"))(photo.feed)
        stem = f"{report.subject}-{report.precision}-{art.name}"
        if adapter.picture_kind == "detections":
            path = detection_overlay(photo.feed[adapter.input_name][0], photo.outputs["output0"], got["output0"],
                                     folder / f"{stem}-detections.png", end2end=metadata.get("end2end") == "True")
        elif adapter.picture_kind == "depth":
            path = depth_error_heatmap(photo.outputs["depth"], got["depth"], folder / f"{stem}-depth-error.png")
        else:  # the family draws no picture of its task
            continue
        art.pictures.append(str(path))
