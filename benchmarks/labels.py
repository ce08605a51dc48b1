"""verify --data against Ultralytics' own val: the figures each precision gets against a dataset's labels.

For each trained model and its dataset: ``enginekit.verify`` with ``data=`` at the precisions asked for (the
FP32 PyTorch model, every graph, and the engine where a GPU runs it, each scored against the labels), then
``YOLO(pt).val(data=..., batch=1)`` (Ultralytics' default rectangular batches, and ``rect=False``), and the
gap between enginekit's FP32 figure and val's. Prints one JSON object per model; quote it.

    python benchmarks/labels.py models/v8s-composites.pt data/v8s-composites/data.yaml --model yolov8s \\
        --precision fp16,int8 --calib-data data/v8s-composites/data.yaml --calib-count 64
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _val(weights: Path, data: Path, imgsz: int, limit_note: str, **kw) -> dict:
    from ultralytics import YOLO

    r = YOLO(str(weights)).val(data=str(data), batch=1, imgsz=imgsz, plots=False, verbose=False, workers=0,
                               project=os.environ.get("TMPDIR", "/tmp") + "/labels-val", **kw)
    out = {k.replace("metrics/", ""): round(float(v), 5) for k, v in r.results_dict.items() if k.startswith("metrics/")}
    return {**out, "note": limit_note}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("--model", required=True, help="enginekit's name for the architecture (yolov8s, yolo11n-seg)")
    ap.add_argument("--precision", default="fp32", help="fp32, fp16, int8 or a list")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--limit", type=int, default=None, help="score this many val images (Ultralytics val: all)")
    ap.add_argument("--calib-data", default=None)
    ap.add_argument("--calib-count", type=int, default=None)
    ap.add_argument("--repair", action="store_true")
    ap.add_argument("--no-val", action="store_true", help="skip Ultralytics' val")
    args = ap.parse_args()

    import enginekit

    build = {"weights": args.weights, "profiles": [f"1x3x{args.imgsz}x{args.imgsz}"]}
    if args.calib_data:
        build["calib_data"] = args.calib_data
    if args.calib_count:
        build["calib_count"] = args.calib_count
    if args.repair:
        build["repair"] = True
    start = time.perf_counter()
    outcome = enginekit.verify(args.model, precision=args.precision, data=args.data, data_limit=args.limit,
                               build_options=build, quiet=True)
    seconds = time.perf_counter() - start
    rows = [{k: r[k] for k in ("precision", "artifact", "value", "drop", "limit", "passed", "size_mb", "latency_ms")}
            for r in outcome.ladder]
    artifacts = {}
    for report in outcome.reports:
        for art in report.artifacts:
            if art.ground_truth:
                artifacts[f"{art.precision}/{art.name}"] = {k: v for k, v in art.ground_truth.items()
                                                            if k not in ("reference", "identity")}
    result = {"model": args.model, "weights": str(args.weights), "data": str(args.data), "limit": args.limit,
              "precision": args.precision, "verify_seconds": round(seconds, 1), "passed": outcome.passed,
              "ladder": rows, "artifacts": artifacts}
    ref = next((r for r in outcome.ladder if r["artifact"] == "PyTorch"), None)
    if not args.no_val and args.limit is None:
        note = "Ultralytics val, batch 1"
        val = _val(args.weights, args.data, args.imgsz, note)
        flat = _val(args.weights, args.data, args.imgsz, note + ", rect=False", rect=False)
        result["ultralytics_val"] = {"default": val, "rect_false": flat}
        if ref is not None:
            key = {"map50_95": "mAP50-95(B)", "mask_map50_95": "mAP50-95(M)", "pose_map50_95": "mAP50-95(P)"}.get(
                ref["metric"], "mAP50-95(B)")
            result["fp32_gap"] = {"enginekit": round(ref["value"], 5), "val_default": val[key],
                                  "abs_gap_default": round(abs(ref["value"] - val[key]), 5),
                                  "val_rect_false": flat[key], "abs_gap_rect_false": round(abs(ref["value"] - flat[key]), 5)}
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
