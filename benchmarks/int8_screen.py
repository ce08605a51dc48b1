"""INT8 repair's screen held against every node measured, on the suite's failing detectors.

``build --repair`` ranks the quantized nodes by their own rounding in one ONNX Runtime run per photograph
(``compare.repair.own_error``) and measures the effect on the gates of the first ``flows.repair.MEASURE`` only
(one full evaluation each, ``measured_effect``). Here each detector is repaired twice from the same quantized
graph, once so and once with every node measured, and the two are set side by side: where the screen puts the
nodes the full measurement ranks first, the rank correlation of the two figures, and what each repair keeps, in
how many trials, in how many seconds.

    PYTHONPATH=src:tests python benchmarks/int8_screen.py [--json OUT]

Detectors (tests/trained_detector.py, trained on generated shapes at 160 px): ``planted`` (one INT8-hostile layer,
tests/test_repair_search.py, at 320) and ``spread`` (a tenth of the channels of the first two convolutions 24x wider,
tests/test_one_verdict.py, at 160); 24 generated calibration images each, 8 calibrated on, 16 judged on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]


def _detectors(work: Path) -> list[dict]:
    from test_repair_search import _plant_an_outlier
    from trained_detector import spread_outlier_detector, trained_detector, write_held_out_images

    weights = trained_detector().weights
    planted_images = write_held_out_images(work / "planted-calib", count=24, size=640, seed=4242)
    planted = work / "planted.pt"
    _plant_an_outlier(weights, sorted(planted_images.glob("*.png"))[0], planted)
    spread_images = write_held_out_images(work / "spread-calib", count=24, size=320, seed=4242)
    spread = spread_outlier_detector(weights, work / "spread.pt")
    return [{"name": "planted", "weights": planted, "images": planted_images, "imgsz": 320},
            {"name": "spread", "weights": spread, "images": spread_images, "imgsz": 160}]


def _repair(detector: dict, measure: int, cache_dir: Path) -> dict:
    from enginekit import api
    from enginekit.cache import Cache
    from enginekit.compare import repair as rp
    from enginekit.flows import repair as flow

    seen: dict = {}
    real_screen, real_search = rp.screened_effect, rp.search

    def screen(quantized, source, names, score, feeds, **kw):
        start = time.perf_counter()
        ranking, measured = real_screen(quantized, source, names, score, feeds, **kw)
        seen.update(rank_seconds=time.perf_counter() - start, ranking=ranking, measured=measured,
                    own=rp.own_error(quantized, source, names, feeds), names=list(names))
        return ranking, measured

    def search(*a, **kw):
        start = time.perf_counter()
        try:
            return real_search(*a, **kw)
        finally:
            seen["search_seconds"] = time.perf_counter() - start

    default = flow.MEASURE
    flow.MEASURE, rp.screened_effect, rp.search = measure, screen, search
    start = time.perf_counter()
    try:
        out = api.build("yolov8n", weights=detector["weights"], precision="int8",
                        profiles=[f"1x3x{detector['imgsz']}x{detector['imgsz']}"], calib_data=detector["images"],
                        calib_count=8, repair=True, verify=False, cache=Cache(cache_dir), quiet=True)
        record = out.manifest["repair"]
    finally:
        flow.MEASURE, rp.screened_effect, rp.search = default, real_screen, real_search
    return {**seen, "wall_seconds": time.perf_counter() - start, "record": record}


def _spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from enginekit.flows import repair as flow

    rows = []
    with tempfile.TemporaryDirectory(prefix="int8-screen-") as tmp:
        work = Path(tmp)
        for detector in _detectors(work):
            # each in a cache of its own (a second build of the same request would find the first one's engine); the
            # quantization is ModelOpt's same graph in both (content-keyed), the rank and search times their own
            full = _repair(detector, 10 ** 6, work / f"cache-{detector['name']}-full")
            screened = _repair(detector, flow.MEASURE, work / f"cache-{detector['name']}-screened")
            if "names" not in full:
                print(json.dumps({"detector": detector["name"], "no ranking": full["record"]}, default=str), flush=True)
                continue
            names, effect, own = full["names"], full["measured"], full["own"]
            by_own = sorted(names, key=lambda n: -own.get(n, 0.0))
            by_effect = [n for n in sorted(names, key=lambda n: -effect.get(n, 0.0)) if effect.get(n, 0.0) > 0]
            positions = {n: by_own.index(n) + 1 for n in by_effect[:5]}
            row = {"detector": detector["name"], "imgsz": detector["imgsz"], "nodes": len(names),
                   "measured_first": flow.MEASURE, "spearman_own_vs_effect": round(
                       _spearman([own.get(n, 0.0) for n in names], [effect.get(n, 0.0) for n in names]), 3),
                   "effect_top5_screen_rank": positions}
            for label, result in (("full", full), ("screened", screened)):
                rec = result["record"]
                row[label] = {"kept": rec.get("nodes"), "trials": rec.get("trials"), "passed": rec.get("passed"),
                              "reused": rec.get("reused"), "rank_seconds": round(result.get("rank_seconds", 0), 1),
                              "search_seconds": round(result.get("search_seconds", 0), 1),
                              "build_seconds": round(result["wall_seconds"], 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print("| detector | nodes | ranking | kept in high precision | trials | passes | rank s | search s |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        for label in ("full", "screened"):
            r = row[label]
            what = "every node measured" if label == "full" else f"own rounding, first {row['measured_first']} measured"
            print(f"| {row['detector']} ({row['imgsz']} px) | {row['nodes']} | {what} | {len(r['kept'])}: "
                  f"{', '.join(r['kept'][:4])} | {r['trials']} | {r['passed']} | {r['rank_seconds']} | "
                  f"{r['search_seconds']} |")
    for row in rows:
        print(f"{row['detector']}: Spearman (own rounding vs measured effect) {row['spearman_own_vs_effect']}; the "
              f"measured top 5 in the screen's order: {row['effect_top5_screen_rank']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
