"""The detector's letterbox on a GPU, checked as a user sees it: the bytes, then the boxes.

    python benchmarks/letterbox_gpu.py --weights best.pt [--weights other.pt] [--frames shapes_00.png ...]

1. Bytes: ``exact_resize.letterbox_into`` (the one kernel the default GPU path runs) and ``exact_resize.letterbox``
   (its torch operations) on the GPU, against Ultralytics' ``LetterBox`` (OpenCV) on the host, on the frame sizes of
   ``tests/test_exact_resize.py`` (59 sizes, 6 photographs at three network sizes), BGR kept and swapped.
2. The input: ``Predictor.device_input`` of a default ``enginekit.load(pt)`` against the tensor Ultralytics'
   predictor makes on the same GPU (``predictor.preprocess``), bit for bit.
3. Boxes: ``enginekit.load(pt)`` with no option (the default path) against ``YOLO(pt).predict`` on two non-square
   photographs (bus.jpg 810x1080, zidane.jpg 1280x720) and the given frames resized to 720x1280 and 480x640; same
   count, same classes, each box matched at IoU >= 0.999, scores within 1e-3 (conf 0.05 on both sides).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))


def bytes_check() -> tuple[int, int]:
    import torch

    import test_exact_resize as cases
    from enginekit import exact_resize
    from enginekit.families.ultralytics.runtime import letterbox, letterbox_geometry

    assert exact_resize.kernel_usable(torch.device("cuda")), exact_resize._BROKEN
    same = total = 0
    for name, frame, net, rect in cases._frames():
        (uh, uw), top, bottom, left, right = letterbox_geometry(frame.shape[:2], net, auto=rect, stride=32)
        theirs = letterbox(net, auto=rect, stride=32)(image=frame)
        gpu = torch.from_numpy(frame).cuda()
        for swap in (False, True):
            want = np.ascontiguousarray((theirs[..., ::-1] if swap else theirs).transpose(2, 0, 1))
            out = torch.empty((3, *want.shape[1:]), dtype=torch.float32, device="cuda")
            exact_resize.letterbox_into(gpu, out, (uh, uw), (top, bottom, left, right), swap=swap)
            ops = exact_resize.letterbox((gpu.flip(-1) if swap else gpu).permute(2, 0, 1).float(), (uh, uw),
                                         (top, bottom, left, right))
            want_t = torch.from_numpy(want).cuda()
            ok = torch.equal(out, want_t.float().div_(255)) and torch.equal(ops.to(torch.uint8), want_t)
            same += ok
            total += 1
            if not ok:
                print(f"  bytes differ: {name} swap={swap}")
    return same, total


def photographs() -> list[Path]:
    import ultralytics

    assets = Path(ultralytics.__file__).parent / "assets"
    return [assets / "bus.jpg", assets / "zidane.jpg"]


def frames(extra: list[str]) -> list[tuple[str, np.ndarray]]:
    import cv2

    out = [(p.name, cv2.imread(str(p))) for p in photographs()]
    for f in extra:
        img = cv2.imread(f)
        for h, w in ((720, 1280), (480, 640)):
            out.append((f"{Path(f).name}@{h}x{w}", cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR)))
    return out


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter + 1e-12)


BACKEND = "torch"


def boxes_check(weights: str, items: list[tuple[str, np.ndarray]]) -> list[str]:
    import torch
    from ultralytics import YOLO

    import enginekit

    predictor = enginekit.load(weights, conf=0.05, backend=BACKEND)
    model = YOLO(weights, task="detect")
    lines = [f"{Path(weights).name}: {predictor.backend} on {predictor.device}, {predictor.precision} ({predictor.reason})"]
    for name, bgr in items:
        # the first call runs stage by stage, the next ones replay the step's own graph (``runtime.step_graph``)
        calls = [predictor(bgr) for _ in range(3)]
        ours = calls[-1]
        same_calls = all(len(c.boxes) == len(ours.boxes) and np.array_equal(c.boxes, ours.boxes)
                         and np.array_equal(c.scores, ours.scores) for c in calls)
        theirs = model.predict(bgr, device=0, conf=0.05, verbose=False)[0].boxes
        tb, ts, tc = (theirs.xyxy.cpu().numpy(), theirs.conf.cpu().numpy(), theirs.cls.cpu().numpy().astype(int))
        ob, os_, oc = ours.boxes, ours.scores, ours.class_ids
        ok = len(ob) == len(tb)
        worst, dscore = 1.0, 0.0
        if ok and len(ob):
            m = iou(ob, tb)
            j = m.argmax(1)
            worst = float(m[np.arange(len(ob)), j].min())
            ok = len(set(j.tolist())) == len(j) and bool((oc == tc[j]).all()) and worst >= 0.999
            dscore = float(np.abs(os_ - ts[j]).max())
            ok = ok and dscore <= 1e-3
        # the input itself, against Ultralytics' predictor's on the same GPU
        want = model.predictor.preprocess([bgr])
        hw = predictor.processor.input_hw(bgr.shape[:2])
        got = predictor.device_input([bgr], hw)
        torch.cuda.synchronize()
        same_input = tuple(got.shape) == tuple(want.shape) and torch.equal(got, want.float())
        lines.append(f"  {name} {bgr.shape[1]}x{bgr.shape[0]}: {len(ob)} vs {len(tb)} boxes, worst IoU {worst:.6f}, "
                     f"score diff {dscore:.2e}, input {'equal' if same_input else 'DIFFERS'}, 3 calls "
                     f"{'equal' if same_calls else 'DIFFER'}, step graphs {len(predictor._step_graphs)} "
                     f"{'ok' if ok and same_input and same_calls else 'MISMATCH'}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", action="append", default=[])
    ap.add_argument("--frames", nargs="*", default=[])
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("letterbox_gpu.py needs a CUDA GPU")
    missing = [f for f in [*args.weights, *args.frames] if not Path(f).is_file()]
    if missing:
        raise SystemExit(f"error: not found: {', '.join(missing)}")
    same, total = bytes_check()
    print(f"bytes: letterbox_into and letterbox on the GPU equal OpenCV's on {same} of {total} (frame, channel order)")
    items = frames(args.frames)
    bad = same != total
    for w in args.weights:
        for line in boxes_check(w, items):
            print(line)
            bad = bad or line.endswith("MISMATCH")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
