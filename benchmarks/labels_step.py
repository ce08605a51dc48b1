"""The labelling step of ``verify --data`` timed: how long scoring against the labels takes, per candidate.

Runs ``enginekit.api.verify`` (FP32: the PyTorch reference and each graph scored against the labels) on a fresh
cache and prints, as one JSON object, each ``labels: ...`` stage's seconds and their sum, with whether torchvision
was imported before (Ultralytics' NMS takes its fast kernel only then: enginekit imports it itself now).

    python benchmarks/labels_step.py best.pt data.yaml [--model yolov8n] [--imgsz 160] [--torchvision-first]

The default split is the suite's labelled one (``tests/trained_detector.py``'s val images and the trained detector)
when no files are given.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", nargs="?", type=Path)
    ap.add_argument("data", nargs="?", type=Path)
    ap.add_argument("--model", default=None, help="a model name to give with the weights (older releases needed one)")
    ap.add_argument("--imgsz", type=int, default=160)
    ap.add_argument("--torchvision-first", action="store_true", help="import torchvision before anything else")
    args = ap.parse_args()
    if args.torchvision_first:
        import torchvision  # noqa: F401
    imported_before = "torchvision" in sys.modules
    work = Path(tempfile.mkdtemp(prefix="labels-step-"))
    weights, data = args.weights, args.data
    if weights is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from trained_detector import trained_detector, write_dataset

        weights, data = trained_detector().weights, write_dataset(work / "data")
        args.model = args.model or None
    from enginekit import api
    from enginekit.cache import Cache

    options = {"weights": weights, "profiles": [f"1x3x{args.imgsz}x{args.imgsz}"]}
    start = time.perf_counter()
    outcome = api.verify(args.model or str(weights), data=data, build_options=options, cache=Cache(work / "cache"),
                         quiet=True)
    total = time.perf_counter() - start
    stages = [e for e in outcome.events if e.kind == "stage" and e.label.startswith("labels:")]
    print(json.dumps({"weights": str(weights), "data": str(data), "imgsz": args.imgsz,
                      "torchvision_imported_before": imported_before,
                      "labels_seconds": _by_label(stages),
                      "labels_seconds_total": round(sum(e.seconds or 0 for e in stages), 2),
                      "verify_seconds": round(total, 2), "passed": outcome.passed}, indent=1))


def _by_label(stages) -> dict:
    """Seconds per stage label, summed where a label repeats (the PyTorch reference is scored once, then found)."""
    out: dict = {}
    for e in stages:
        out[e.label] = round(out.get(e.label, 0.0) + (e.seconds or 0.0), 3)
    return out


if __name__ == "__main__":
    main()
