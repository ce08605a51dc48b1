"""INT8 calibration on the suite's trained detector: which calibration set and method keep the FP32 detections.

Judged at the operating point users run: detections at confidence 0.25 of the INT8 graph (ONNX Runtime,
CPU) against those of the FP32 PyTorch model on the same inputs, matched one to one (same class,
IoU >= 0.5): recall, precision; and mAP50 over the INT8 graph's confidences (down to 0.001) with the
FP32 detections at 0.25 as ground truth (Ultralytics' ap_per_class). Evaluation images are generated
shapes never used for calibration.

    PYTHONPATH=src:tests python benchmarks/int8_calibration.py [--size 640] [--profile-hit]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

CONF = 0.25


def detections(output: np.ndarray, conf: float) -> list[np.ndarray]:
    import torch
    from ultralytics.utils.nms import non_max_suppression

    # max_time_img: Ultralytics' NMS stops after 2 s + 0.05 s per image and drops the rest; a slow CPU is no reason
    return [d.numpy() for d in non_max_suppression(torch.from_numpy(output), conf_thres=conf, iou_thres=0.7,
                                                    max_det=300, max_time_img=60.0)]


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    ix = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    iy = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = ix * iy
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
    return inter / (area(box) + area(boxes) - inter + 1e-9)


def _true_positives(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Greedy by candidate confidence: a candidate is a hit when an unmatched reference box of its class has IoU >= 0.5."""
    hits = np.zeros(len(cand), bool)
    used = np.zeros(len(ref), bool)
    for i in np.argsort(-cand[:, 4]):
        if not len(ref):
            break
        ious = _iou(cand[i, :4], ref[:, :4])
        ious[(ref[:, 5] != cand[i, 5]) | used] = 0
        j = int(np.argmax(ious))
        if ious[j] >= 0.5:
            hits[i], used[j] = True, True
    return hits


def task_metrics(ref_out: np.ndarray, cand_out: np.ndarray) -> dict[str, float]:
    from ultralytics.utils.metrics import ap_per_class

    refs, cands, cands_all = detections(ref_out, CONF), detections(cand_out, CONF), detections(cand_out, 0.001)
    n_ref = sum(len(r) for r in refs)
    n_cand = sum(len(c) for c in cands)
    hits = sum(int(_true_positives(r, c).sum()) for r, c in zip(refs, cands))
    tp, conf, pred_cls, target_cls = [], [], [], []
    for r, c in zip(refs, cands_all):
        tp.append(_true_positives(r, c))
        conf.append(c[:, 4])
        pred_cls.append(c[:, 5])
        target_cls.append(r[:, 5])
    tp = np.concatenate(tp)[:, None].repeat(10, 1)  # ap_per_class wants 10 IoU columns; only 0.5 is used
    ap = ap_per_class(tp, np.concatenate(conf), np.concatenate(pred_cls), np.concatenate(target_cls))[5]
    return {"ref": n_ref, "recall": hits / max(n_ref, 1), "precision": hits / max(n_cand, 1),
            "map50": float(ap[:, 0].mean()) if len(ap) else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--eval-images", type=int, default=8)
    parser.add_argument("--methods", default="entropy,max")
    parser.add_argument("--sets", default="photos8,photos8x4,shapes8,shapes2x16,shapes8x4")
    parser.add_argument("--profile-hit", action="store_true", help="cProfile a calibration-cache hit")
    args = parser.parse_args()

    import onnxruntime as ort
    import torch
    from ultralytics import YOLO

    from enginekit import api
    from enginekit.cache import Cache
    from enginekit.calibration import augmented_views
    from enginekit.families import resolve
    from enginekit.images import embedded_image_paths, read_rgb
    from enginekit.stages.int8 import quantize_int8
    from trained_detector import HELD_OUT_SEED, held_out_images, trained_detector

    torch.set_num_threads(2)
    found = trained_detector()
    adapter = resolve(found.model)
    size = args.size
    work = Path(tempfile.mkdtemp(prefix="int8-calibration-"))
    onnx_fp32 = work / "yolov8n.onnx"
    api.export(found.model, weights=found.weights, input=f"1x3x{size}x{size}", output=onnx_fp32,
               cache=Cache(work / "cache"), quiet=True)

    def batch(images):
        return np.concatenate([adapter.preprocess(img, (size, size)) for img in images]).astype(np.float32)

    evaluation = batch([img for img, _ in held_out_images(args.eval_images, size, seed=HELD_OUT_SEED)])
    model = YOLO(str(found.weights)).model.float().eval()
    with torch.no_grad():
        ref = model(torch.from_numpy(evaluation))
    ref = (ref[0] if isinstance(ref, (list, tuple)) else ref).numpy()

    def run_onnx(path: Path) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return np.concatenate([session.run(None, {"images": evaluation[i:i + 1]})[0] for i in range(len(evaluation))])

    photos = [read_rgb(p) for p in embedded_image_paths()[:8]]
    shapes = [img for img, _ in held_out_images(8, size, seed=HELD_OUT_SEED + 10_000)]  # not the evaluation's
    sets = {
        "photos8": photos,  # today's default: the 8 embedded photographs
        "photos8x4": augmented_views(photos, 32),
        "shapes8": shapes,  # a folder of the user's own images
        "shapes2x16": augmented_views(shapes[:2], 32),
        "shapes8x4": augmented_views(shapes, 32),
    }
    rows = [("fp32 onnx", "-", 0.0, task_metrics(ref, run_onnx(onnx_fp32)))]
    caches: dict[str, Path] = {}
    for name in args.sets.split(","):
        calib = batch(sets[name])
        for method in args.methods.split(","):
            out, cache = work / f"{name}.{method}.onnx", work / f"{name}.{method}.calib"
            report = quantize_int8(onnx_fp32, out, calib, "images", method=method, exclude_nodes=adapter.int8_exclude,
                                   write_cache=cache)
            caches[method] = cache
            rows.append((f"{method}", f"{name} ({len(calib)})", report.seconds, task_metrics(ref, run_onnx(out))))
            _print_row(rows[-1], flush=True)

    print(f"\nINT8 vs FP32 PyTorch detections, conf {CONF}, IoU 0.5, {len(evaluation)} held-out shape images "
          f"at {size}x{size} ({rows[0][3]['ref']} FP32 detections); ONNX Runtime CPU")
    print(f"{'method':8} {'calibration set':18} {'recall':>7} {'prec.':>7} {'mAP50':>7} {'calib s':>8}")
    for row in rows:
        _print_row(row)

    # calibration-cache hit against calibrating afresh (the same graph and settings)
    method = args.methods.split(",")[0]
    calib = batch(sets[args.sets.split(",")[0]])
    fresh = quantize_int8(onnx_fp32, work / "fresh.onnx", calib, "images", method=method,
                          exclude_nodes=adapter.int8_exclude, write_cache=work / "fresh.calib")
    hit = quantize_int8(onnx_fp32, work / "hit.onnx", None, "images", method=method,
                        exclude_nodes=adapter.int8_exclude, calibration_cache=work / "fresh.calib",
                        input_shape=(1, 3, size, size))
    same = (work / "fresh.onnx").read_bytes() == (work / "hit.onnx").read_bytes()
    print(f"\ncache hit {hit.seconds:.2f} s vs fresh {fresh.seconds:.2f} s ({fresh.seconds / hit.seconds:.1f}x), "
          f"identical bytes: {same}")
    if args.profile_hit:
        profiler = cProfile.Profile()
        profiler.enable()
        quantize_int8(onnx_fp32, work / "hit2.onnx", None, "images", method=method, exclude_nodes=adapter.int8_exclude,
                      calibration_cache=work / "fresh.calib", input_shape=(1, 3, size, size))
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        print(text.getvalue())


def _print_row(row, flush=False) -> None:
    method, name, seconds, m = row
    print(f"{method:8} {name:18} {m['recall']:7.3f} {m['precision']:7.3f} {m['map50']:7.3f} {seconds:8.1f}",
          flush=flush)


if __name__ == "__main__":
    main()
