"""The property the user-file corpus (``tests/user_files.py``) is held to: for every file ``YOLO(file)`` loads,
``enginekit.load(file)`` predicts what ``YOLO(file).predict`` does on the same non-square frames (boxes IoU >= 0.99,
same classes; rotated boxes by their rotated IoU; masks IoU >= 0.95 against its ``retina_masks`` masks, at the
photograph's size as enginekit's; keypoints within 2 px; classify: the same top-1), or refuses in one line naming a
missing capability, never a missing name.

    python tests/user_files_check.py      # every corpus file, one line each (the figures the notes quote)
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PHOTOS = ("bus.jpg", "zidane.jpg")  # 810x1080 and 1280x720: neither square
MIN_IOU = 0.99
#: the confidence both sides keep instances at: under Ultralytics' 0.25, so that more instances are compared
CONF = 0.1


def frames(folder: Path, task: str) -> list[Path]:
    """Two photographs Ultralytics ships and one 480x640 frame of the shapes the corpus' models were trained on (the
    task's own drawing), so that every model finds something to compare."""
    import cv2
    import ultralytics

    out = [Path(ultralytics.__file__).parent / "assets" / p for p in PHOTOS]
    shapes = folder / f"shapes-{task}.jpg"
    if not shapes.is_file():
        rng = np.random.default_rng(20_000 + len(task))
        if task == "detect":  # drawn as the models' training images (160 px), then brought to 480x640
            from trained_detector import draw_image

            image = draw_image(rng, 120, 160, (3, 5), (24, 56))[0]
        else:
            from trained_tasks import draw_image

            image = draw_image(rng, (120, 160), (3, 4), (34, 60))[0]
        image = cv2.resize(image, (640, 480), interpolation=cv2.INTER_LINEAR)
        cv2.imwrite(str(shapes), np.ascontiguousarray(image[..., ::-1]))
    return [*out, shapes]


@dataclass
class Compared:
    file: str
    frames: int
    instances: int  # what Ultralytics found, summed over the frames (what was compared)
    worst_iou: float  # lowest IoU of a matched instance (1.0 where nothing was found)
    same: bool
    detail: str = ""
    seconds: float = 0.0


MIN_MASK_IOU = 0.95
MAX_KEYPOINT_PX = 2.0


def _their_extra(result, task: str):
    """Masks at the photograph's resolution (bool N x H x W: Ultralytics' ``retina_masks`` path, which enginekit's
    masks follow) or keypoints (N x K x 3), or None."""
    if task == "segment" and result.masks is not None:
        return result.masks.data.cpu().numpy() > 0.5
    if task == "segment":
        return np.zeros((0, *result.orig_shape), bool)
    if task == "pose":
        return result.keypoints.data.cpu().numpy() if result.keypoints is not None else np.zeros((0, 0, 3), np.float32)
    return None


def _our_extra(result, task: str):
    if task == "segment":
        return np.asarray(result.masks, dtype=bool)
    if task == "pose":
        return np.asarray(result.keypoints, dtype=np.float32)
    return None


def _extra_detail(task: str, ours, theirs, matched) -> str:
    """Where matched instances' masks (IoU) or keypoints (pixels) differ beyond the property's limits; "" if not."""
    if ours is None or theirs is None or not len(matched):
        return ""
    if task == "segment":
        worst = 1.0
        for t, o in enumerate(matched):
            a, b = theirs[t], ours[o]
            union = np.logical_or(a, b).sum()
            worst = min(worst, float(np.logical_and(a, b).sum() / union) if union else 1.0)
        return f"mask IoU {worst:.3f}" if worst < MIN_MASK_IOU else ""
    worst = float(np.abs(theirs[:, :, :2] - ours[matched][:, :, :2]).max())
    return f"keypoints {worst:.2f} px apart" if worst > MAX_KEYPOINT_PX else ""


def _theirs(result, task: str):
    if task == "classify":
        return int(result.probs.top1), None, None
    if task == "obb":
        o = result.obb
        return o.cls.cpu().numpy().astype(int), o.xywhr.cpu().numpy(), o.conf.cpu().numpy()
    b = result.boxes
    return b.cls.cpu().numpy().astype(int), b.xyxy.cpu().numpy(), b.conf.cpu().numpy()


def _ours(result, task: str):
    if task == "classify":
        return int(np.asarray(result.class_ids)[0]), None, None
    boxes = np.asarray(result.boxes, dtype=np.float32).reshape(-1, 5 if task == "obb" else 4)
    return np.asarray(result.class_ids).astype(int), boxes, np.asarray(result.scores)


def compare_file(path: Path, task: str, folder: Path, **load_options) -> Compared:
    """``enginekit.load(path)`` against ``YOLO(path).predict`` on ``frames``."""
    from ultralytics import YOLO

    import enginekit
    from enginekit.compare.instances import Instances, box_iou, rotated_iou

    start = time.perf_counter()
    predictor = enginekit.load(str(path), conf=CONF, **load_options)
    model = YOLO(str(path), task=task)
    images = frames(folder, task)
    found, worst, details = 0, 1.0, []
    for image in images:
        our_result = predictor(str(image))
        # masks at the photograph's size, as enginekit gives them (the boxes are the same either way)
        their_result = model.predict(str(image), conf=CONF, verbose=False, retina_masks=task == "segment")[0]
        ours, theirs = _ours(our_result, task), _theirs(their_result, task)
        if task == "classify":
            found += 1
            if ours[0] != theirs[0]:
                details.append(f"{image.name}: top-1 {ours[0]} vs {theirs[0]}")
            continue
        (oc, ob, os_), (tc, tb, ts) = ours, theirs
        found += len(tc)
        if len(oc) != len(tc):
            details.append(f"{image.name}: {len(oc)} instances vs {len(tc)}")
            continue
        if not len(tc):
            continue
        iou_of = rotated_iou if task == "obb" else box_iou
        iou = np.asarray(iou_of(Instances(tb, ts, tc), Instances(ob, os_, oc)))
        best = iou.argmax(1)
        worst = min(worst, float(iou.max(1).min()))
        if iou.max(1).min() < MIN_IOU or not (oc[best] == tc).all():
            details.append(f"{image.name}: IoU {iou.max(1).min():.3f}, classes {oc[best].tolist()} vs {tc.tolist()}")
            continue
        extra = _extra_detail(task, _our_extra(our_result, task), _their_extra(their_result, task), best)
        if extra:
            details.append(f"{image.name}: {extra}")
    return Compared(path.name, len(images), found, worst, not details, "; ".join(details),
                    time.perf_counter() - start)


def main() -> int:
    import tempfile

    from user_files import corpus

    files = corpus()
    folder = Path(tempfile.mkdtemp(prefix="user-files-check-"))
    failed = 0
    for f in files:
        try:
            c = compare_file(f.path, f.task, folder, backend="onnxruntime-cpu")
        except Exception as exc:  # noqa: BLE001 - listed, then counted
            failed += 1
            print(f"{f.name:32s} {f.kind:10s} REFUSED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        failed += not c.same
        print(f"{f.name:32s} {f.kind:10s} {'same' if c.same else 'DIFFERENT'}  {c.instances:3d} instances on "
              f"{c.frames} frames, worst IoU {c.worst_iou:.4f}, {c.seconds:5.1f} s {c.detail}")
    print(f"{len(files) - failed} of {len(files)} files predict as YOLO(file).predict")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
