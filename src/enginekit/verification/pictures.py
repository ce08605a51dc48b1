"""Pictures that say more than numbers (PNG): detection overlays, depth error heatmaps, class map differences.

A family declares which picture its task has (``picture_kind``) and decodes its own outputs for it
(``picture_boxes``, ``picture_map``: as its task metrics decode them); this module only draws. Each
picture is a title strip over its panels; panels of small inputs are enlarged (nearest neighbour, an
input pixel stays a block of pixels) so the title fits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from enginekit._version import __version__
from enginekit.compare.task_metrics import align_scale_shift
from enginekit.fsutil import atomic_copy
from enginekit.verification.gate import onnx_runner
from enginekit.verification.references import onnx_accepts_hw

TITLE_H = 28  # the title strip above the panels
MIN_SIDE = 256  # panels of smaller inputs are enlarged by a whole factor to at least this height
REFERENCE_BGR, CANDIDATE_BGR = (0, 200, 0), (0, 0, 230)


def _factor(h: int) -> int:
    return max(1, -(-MIN_SIDE // max(h, 1)))


def _enlarge(img: np.ndarray, k: int) -> np.ndarray:
    return img if k == 1 else np.repeat(np.repeat(img, k, axis=0), k, axis=1)


def _titled(panel: np.ndarray, title: str) -> np.ndarray:
    import cv2

    strip = np.zeros((TITLE_H, panel.shape[1], 3), np.uint8)
    cv2.putText(strip, title, (8, 19), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255), 1, cv2.LINE_AA)
    return np.concatenate([strip, panel], axis=0)


def _write(path: Path, picture: np.ndarray) -> Path:
    import cv2

    if not cv2.imwrite(str(path), picture):
        raise OSError(f"cannot write {path}")
    return path


def _image_bgr(image_chw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray((np.clip(image_chw, 0, 1) * 255).astype(np.uint8).transpose(1, 2, 0)[:, :, ::-1])


def _draw_boxes(img: np.ndarray, boxes: np.ndarray, k: int, color, thickness: int) -> None:
    import cv2

    for box in np.asarray(boxes, dtype=np.float64):
        if len(box) == 5:  # rotated: centre, size, angle (radians)
            cx, cy, w, h = box[:4] * k
            corners = cv2.boxPoints(((cx, cy), (w, h), float(np.degrees(box[4]))))
            cv2.polylines(img, [np.round(corners).astype(np.int32)], True, color, thickness)
        else:
            x1, y1, x2, y2 = np.round(box * k).astype(int)
            cv2.rectangle(img, (x1, y1), (x2, y2), color, thickness)


def detection_overlay(image_chw: np.ndarray, reference_boxes: np.ndarray, candidate_boxes: np.ndarray,
                      path: Path) -> Path:
    """Reference boxes in green (thick), candidate boxes in red (thin) on the model's input image.
    Boxes: (N, 4) corners or (N, 5) rotated boxes in the input's pixels (``ModelAdapter.picture_boxes``)."""
    k = _factor(image_chw.shape[1])
    img = np.ascontiguousarray(_enlarge(_image_bgr(image_chw), k))
    _draw_boxes(img, reference_boxes, k, REFERENCE_BGR, 3)
    _draw_boxes(img, candidate_boxes, k, CANDIDATE_BGR, 1)
    title = f"reference {len(reference_boxes)} (green) / candidate {len(candidate_boxes)} (red)"
    return _write(path, _titled(img, title))


def depth_error_heatmap(reference: np.ndarray, candidate: np.ndarray, path: Path) -> Path:
    """Reference depth | candidate depth | relative error (after scale-and-shift alignment); maps (H, W)."""
    import cv2

    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    mask = ref > 1e-3 * max(float(ref.max()), 1e-12)
    aligned = align_scale_shift(cand, ref, mask) if mask.any() else cand
    err = np.where(mask, np.abs(aligned - ref) / np.maximum(ref, 1e-12), 0.0)

    def colour(a: np.ndarray, hi: float) -> np.ndarray:
        scaled = np.clip(a / max(hi, 1e-12), 0, 1)
        return cv2.applyColorMap((scaled * 255).astype(np.uint8), cv2.COLORMAP_INFERNO)

    hi = float(np.percentile(ref, 99)) or 1.0
    err_hi = max(float(np.percentile(err, 99)), 1e-6)
    panel = np.concatenate([colour(ref, hi), colour(aligned, hi), colour(err, err_hi)], axis=1)
    return _write(path, _titled(_enlarge(panel, _factor(ref.shape[0])),
                                f"reference | candidate | rel. error (p99 {err_hi:.2g})"))


def class_map_difference(image_chw: np.ndarray, reference: np.ndarray, candidate: np.ndarray, path: Path) -> Path:
    """Reference classes | candidate classes (Ultralytics' palette over the input) | the pixels whose class
    differs (white; black where the classes agree). Maps (H, W) of class ids at the input's size."""
    import cv2
    from ultralytics.utils.plotting import colors

    ref, cand = reference.astype(np.int64), candidate.astype(np.int64)
    h, w = ref.shape
    img = _image_bgr(image_chw)
    if img.shape[:2] != (h, w):
        img = cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
    palette = np.array([colors(i, bgr=True) for i in range(int(max(ref.max(), cand.max())) + 1)], np.uint8)

    def overlay(class_map: np.ndarray) -> np.ndarray:
        return (0.4 * img + 0.6 * palette[class_map]).astype(np.uint8)

    differ = ref != cand
    panel = np.concatenate([overlay(ref), overlay(cand), np.repeat((differ * 255).astype(np.uint8)[..., None], 3, 2)],
                           axis=1)
    title = f"reference | candidate | {int(differ.sum())} pixels differ ({100 * differ.mean():.2g}%)"
    return _write(path, _titled(_enlarge(panel, _factor(h)), title))


def _detections(adapter, image_chw, reference, candidate, metadata, stem: Path) -> Path:
    conf = adapter.task_options.get("conf", 0.25)
    hw = tuple(image_chw.shape[1:])
    ref, cand = (adapter.picture_boxes(o, metadata, hw, conf) for o in (reference, candidate))
    return detection_overlay(image_chw, ref, cand, stem.with_name(f"{stem.name}-detections.png"))


def _depth(adapter, image_chw, reference, candidate, metadata, stem: Path) -> Path:
    ref, cand = (adapter.picture_map(o, metadata) for o in (reference, candidate))
    return depth_error_heatmap(ref, cand, stem.with_name(f"{stem.name}-depth-error.png"))


def _semantic(adapter, image_chw, reference, candidate, metadata, stem: Path) -> Path:
    ref, cand = (adapter.picture_map(o, metadata) for o in (reference, candidate))
    return class_map_difference(image_chw, ref, cand, stem.with_name(f"{stem.name}-classes.png"))


#: ``ModelAdapter.picture_kind`` -> what draws it
PICTURES = {"detections": _detections, "depth": _depth, "semantic": _semantic}


def draw_picture(adapter, image_chw: np.ndarray, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                 metadata: dict[str, str], stem: Path) -> Path | None:
    """The family's picture (``adapter.picture_kind``) of a candidate against the reference on one input
    (3, H, W), written as ``<stem>-<kind>.png``; None where the family draws none."""
    draw = PICTURES.get(adapter.picture_kind) if adapter.picture_kind else None
    return draw(adapter, image_chw, reference, candidate, metadata, stem) if draw else None


#: part of every stored picture's key: bump when a picture's drawing changes
PICTURE_VERSION = 1


def picture_path(folder: Path, report, art, suffix: str) -> Path:
    """Where an artifact's picture goes in a report folder (``suffix``: "-detections.png"): named by the subject,
    precision, engine and artifact, so a folder of several engines of one model keeps each one's pictures."""
    engine = f"-{report.engine_key[:12]}" if report.engine_key else ""
    return Path(folder) / f"{report.subject}-{report.precision}{engine}-{art.name}{suffix}"


def draw_pictures(report, refs, entry, cache, adapter, metadata, folder: Path) -> None:
    """One picture per checked ONNX artifact of an engine entry, on the first photograph. A picture is kept
    in the cache by what it shows (the graph's content, the references), so a second report draws none."""
    if adapter.picture_kind is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    by_name = {f"onnx-{link['stage']}": link for link in entry.manifest.get("chain", []) if "kind" in link}
    for art in report.artifacts:
        if not art.ran or art.kind != "onnx" or art.name not in by_name:
            continue
        link = by_name[art.name]
        graph = cache.lookup(link["kind"], link["key"]).entry.file("model.onnx")

        def produce(tmp: Path, graph=graph) -> dict:
            # the photograph as the graph's runtime letterboxes it (its own rectangle where the graph takes that)
            photo = next((c for c in refs.cases_for(onnx_accepts_hw(graph)) if c.kind == "photo"), None)
            if photo is None:  # random inputs only (an .npy calibration set): nothing a picture could show
                return {"picture": None}
            got = onnx_runner(graph)(photo.feed)
            path = draw_picture(adapter, photo.feed[adapter.input_name][0], photo.outputs, got, metadata,
                                tmp / "picture")
            return {"picture": path.name if path is not None else None}

        parts = {"stage": "picture", "version": PICTURE_VERSION, "enginekit": __version__,
                 "graph": link.get("sha256") or link["key"], "references": refs.key}
        stored, _ = cache.get_or_create("picture", parts, produce, subject=report.subject)
        name = stored.manifest.get("picture")
        if name:
            path = picture_path(folder, report, art, name[len("picture"):])
            atomic_copy(stored.file(name), path)
            art.pictures.append(str(path))
