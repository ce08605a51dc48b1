"""The suite's trained detector: it finds the shapes it was trained on and its scores spread.

Gates are tested on this model because a random YOLO's outputs are the anchor grid with one constant
score; these tests make sure the trained one is not like that.
"""

from __future__ import annotations

import numpy as np
import pytest

from trained_detector import NAMES, held_out_images, photographs


def _iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _match(truth, found, iou: float = 0.5) -> int:
    """Greedy one-to-one matches of found boxes to true boxes (same class, IoU >= iou)."""
    used, hits = set(), 0
    for cls, *box in truth:
        best = max(((i, _iou(box, f[1:])) for i, f in enumerate(found) if f[0] == cls and i not in used),
                   key=lambda t: t[1], default=(None, 0.0))
        if best[0] is not None and best[1] >= iou:
            used.add(best[0])
            hits += 1
    return hits


@pytest.fixture(scope="module")
def yolo(trained_detector):
    from ultralytics import YOLO

    return YOLO(str(trained_detector.weights))


def test_checkpoint_is_an_ordinary_ultralytics_one(trained_detector, yolo):
    assert trained_detector.model == "yolov8n" and trained_detector.names == NAMES
    assert yolo.task == "detect" and tuple(yolo.names.values()) == NAMES
    assert yolo.model.yaml["scale"] == "n"


@pytest.mark.parametrize("size", [160, 640])
def test_finds_held_out_shapes_at_conf_025(yolo, size):
    images = held_out_images(count=8 if size == 160 else 3, size=size)
    truth_count = found_count = hits = 0
    for img, boxes in images:
        result = yolo.predict(img[..., ::-1], imgsz=size, conf=0.25, device="cpu", verbose=False)[0]
        found = [(int(c), *xyxy) for c, xyxy in zip(result.boxes.cls.tolist(), result.boxes.xyxy.tolist())]
        truth_count, found_count = truth_count + len(boxes), found_count + len(found)
        hits += _match(boxes, found)
    assert truth_count >= 15
    recall, precision = hits / truth_count, hits / max(found_count, 1)
    assert recall >= 0.8 and precision >= 0.8, (recall, precision, truth_count, found_count)


def test_scores_spread(yolo, trained_detector):
    """Max class score per anchor: near 1 on the shapes, near 0 on the background, many values between."""
    import cv2
    import torch

    from enginekit.families import resolve

    family = resolve("yolov8n")
    images = [img for img, _ in held_out_images(count=2, size=640)]
    images += [cv2.imread(str(p))[..., ::-1] for p in photographs()]
    batch = np.concatenate([family.preprocess(img, (640, 640)) for img in images])
    model = yolo.model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(batch))
    out = out[0] if isinstance(out, (list, tuple)) else out
    scores = out[:, 4:, :].amax(dim=1).flatten().numpy()  # (batch * anchors,)
    assert scores.max() > 0.8 and np.median(scores) < 0.05, (scores.max(), np.median(scores))
    assert np.quantile(scores, 0.999) - np.quantile(scores, 0.01) > 0.5
    assert len(np.unique(np.round(scores, 3))) > 100  # not one constant: the random model's failure


def test_enginekit_exports_it(run_cli, trained_detector, tmp_path):
    result = run_cli("export", "yolov8n", "--weights", str(trained_detector.weights), "--input", "1x3x320x320",
                     "-o", "m.onnx", env={"ENGINEKIT_CACHE": str(tmp_path / "cache")})
    assert result.code == 0, result.stderr
    assert (tmp_path / "m.onnx").is_file() and "pass" in result.stderr
