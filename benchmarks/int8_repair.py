"""INT8 on trained detectors of different class counts, judged on images it did not calibrate on.

    .venv/bin/python benchmarks/int8_repair.py [--out DIR] [--detectors shapes3,close2,shapes6] [--methods max,entropy]
    .venv/bin/python benchmarks/int8_repair.py --methods default   # no --calib-method: chosen by measurement

Three yolov8n detectors trained by Ultralytics' trainer on generated images (cached beside the suite's own,
``tests/trained_detector.py``): ``shapes3`` is the suite's (red circle, green square, blue triangle);
``close2`` has two close classes (discs of nearly the same orange, told apart by 40 levels of green);
``shapes6`` has six (three shapes in two colours). Per detector: 32 calibration images (16 calibrated on,
the other 16 what ``--repair`` judges its trials on) and 24 check images with their labels, all held out
from training. Per calibration method, as a user runs it::

    enginekit verify yolov8n -w best.pt --imgsz 320 --precision int8 --images check --image-count 24 \\
        --calib-data calib --calib-count 16 --calib-method M --data check/data.yaml

and where that fails, ``enginekit build ... --repair`` then the same verify with ``--repair``. Prints one
markdown row per run: nodes kept in FP32 of the quantizable, recall and precision of the FP32 model's
detections, mAP50-95 against the FP32 model's detections and against the labels (the drop), verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import trained_detector as td  # noqa: E402  (the suite's drawing, training settings and cache)

# class -> (shape, colour(rng) -> RGB)
def _rgb(r, g, b, jitter=18.0):
    return lambda rng: tuple(float(np.clip(c + rng.uniform(-jitter, jitter), 0, 255)) for c in (r, g, b))


DETECTORS = {
    "close2": [("circle", "orange disc", _rgb(235, 120, 30, 12)), ("circle", "amber disc", _rgb(235, 160, 30, 12))],
    "shapes6": [("circle", "red circle", _rgb(220, 40, 40)), ("square", "red square", _rgb(220, 40, 40)),
                ("triangle", "red triangle", _rgb(220, 40, 40)), ("circle", "blue circle", _rgb(40, 60, 220)),
                ("square", "blue square", _rgb(40, 60, 220)), ("triangle", "blue triangle", _rgb(40, 60, 220))],
}
CHECK_SEED, CALIB_SEED = 52_000, 53_000


def draw(rng, h, w, classes, objects=(1, 5), side_px=(18, 64)):
    """One image and its boxes, as trained_detector.draw_image draws them, with these classes."""
    import cv2

    img = td._background(rng, h, w)
    boxes = []
    for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
        for _attempt in range(20):
            side = float(rng.uniform(*side_px))
            x1, y1 = rng.uniform(1, w - side - 1), rng.uniform(1, h - side - 1)
            box = (x1, y1, x1 + side, y1 + side)
            if all(td._iou(box, other[1:]) < 0.1 for other in boxes):
                break
        else:
            continue
        cls = int(rng.integers(0, len(classes)))
        shape, _name, colour = classes[cls]
        colour = colour(rng)
        x1, y1, x2, y2 = box
        cx, cy, s = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1
        if shape == "circle":
            cv2.circle(img, (round(cx), round(cy)), round(s / 2), colour, -1, cv2.LINE_AA)
        elif shape == "square":
            cv2.rectangle(img, (round(x1), round(y1)), (round(x2), round(y2)), colour, -1, cv2.LINE_AA)
        else:
            cv2.fillPoly(img, [np.array([[cx, y1], [x2, y2], [x1, y2]], np.int32)], colour, cv2.LINE_AA)
        boxes.append((cls, x1, y1, x2, y2))
    img += rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), boxes


def write_split(root: Path, classes, count: int, size: int, seed: int, objects=(1, 5), split="val") -> Path:
    import cv2

    rng = np.random.default_rng(seed)
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "labels" / split).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        img, boxes = draw(rng, size, size, classes, objects)
        cv2.imwrite(str(root / "images" / split / f"{i:04d}.png"), img[..., ::-1])
        (root / "labels" / split / f"{i:04d}.txt").write_text("".join(
            f"{c} {(x1 + x2) / 2 / size:.6f} {(y1 + y2) / 2 / size:.6f} {(x2 - x1) / size:.6f} {(y2 - y1) / size:.6f}\n"
            for c, x1, y1, x2, y2 in boxes))
    names = "".join(f"  {i}: {n}\n" for i, (_s, n, _c) in enumerate(classes))
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}")
    return yaml


def trained(name: str) -> Path:
    """The detector's best.pt: the suite's for shapes3, else trained here (cached, under a lock)."""
    if name == "shapes3":
        return td.trained_detector().weights
    from filelock import FileLock

    import hashlib

    key = hashlib.sha256(json.dumps([name, [(s, n) for s, n, _ in DETECTORS[name]], td.DATA, td.TRAIN,
                                     td.cache_key()]).encode()).hexdigest()[:16]
    entry = td.cache_root() / f"yolov8n-{name}-{key}"
    with FileLock(str(entry) + ".lock"):
        if not (entry / "best.pt").exists():
            work = entry.with_name(entry.name + ".tmp")
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            env = dict(os.environ, YOLO_OFFLINE="1", YOLO_VERBOSE="False", YOLO_CONFIG_DIR=str(work / "config"))
            start = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--train-into", str(work), name], env=env, check=True,
                           capture_output=True)
            print(f"trained {name} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
            for scratch in ("runs", "dataset", "config"):
                shutil.rmtree(work / scratch, ignore_errors=True)
            shutil.rmtree(entry, ignore_errors=True)
            work.rename(entry)
    return entry / "best.pt"


def _train_child(work: Path, name: str) -> None:
    import ultralytics.data.utils as data_utils
    from ultralytics import YOLO

    data_utils.check_font = lambda *a, **k: None
    classes = DETECTORS[name]
    root = work / "dataset"
    write_split(root, classes, td.DATA["train_images"], td.DATA["size"], td.DATA["seed"], split="train")
    yaml = write_split(root, classes, td.DATA["val_images"], td.DATA["size"], td.DATA["seed"] + 1)
    settings = {k: v for k, v in td.TRAIN.items() if k != "model"}
    YOLO(td.TRAIN["model"]).train(data=str(yaml), device="cpu", workers=0, plots=False, val=False,
                                  project=str(work / "runs"), name="train", exist_ok=True, verbose=False, **settings)
    shutil.copy2(work / "runs" / "train" / "weights" / "best.pt", work / "best.pt")


def classes_of(name: str):
    if name == "shapes3":
        shapes = ("circle", "square", "triangle")
        return [(shapes[i], td.NAMES[i], lambda rng, i=i: td._colour(rng, i)) for i in range(3)]
    return DETECTORS[name]


def enginekit(*args, cache: Path) -> tuple[int, str, str]:
    env = dict(os.environ, ENGINEKIT_CACHE=str(cache), YOLO_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "enginekit", *args], env=env, capture_output=True, text=True)
    return proc.returncode, proc.stderr, proc.stdout


def row(name: str, method: str, repaired: bool, report: Path, code: int) -> dict:
    data = json.loads((report / "report.json").read_text())
    entry = data["entries"][0]
    art = [a for a in entry["artifacts"] if a.get("ran") and a.get("kind", "onnx") != "engine"][-1]
    task = art.get("task") or {}
    ladder = [r for r in data.get("ladder", []) if r["precision"] == "int8"]
    labels = ladder[-1] if ladder else {}
    ref = next((r for r in data.get("ladder", []) if r["artifact"] == "PyTorch"), {})
    return {"detector": name, "method": method, "repair": repaired, "verdict": "pass" if code == 0 else f"fail ({code})",
            "recall": task.get("recall"), "precision": task.get("precision"), "map50_95_vs_fp32": task.get("map50_95"),
            "labels_fp32": ref.get("value"), "labels_int8": labels.get("value"), "labels_drop": labels.get("drop"),
            "failures": entry.get("failures", [])[:3]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("int8-repair"))
    ap.add_argument("--detectors", default="shapes3,close2,shapes6")
    ap.add_argument("--methods", default="max,entropy", help="calibration methods; default: none given (measured)")
    ap.add_argument("--imgsz", default="640", help="network size (640: the shapes at the pixel size they were trained at)")
    args = ap.parse_args()
    out = args.out.resolve()
    rows = []
    for name in args.detectors.split(","):
        weights = trained(name)
        classes = classes_of(name)
        root = out / name
        check = write_split(root / "check", classes, 24, 640, CHECK_SEED, objects=(4, 20))
        calib = root / "calib"
        write_split(calib, classes, 32, 640, CALIB_SEED, objects=(4, 20))
        calib_images = calib / "images" / "val"
        check_images = root / "check" / "images" / "val"
        for method in args.methods.split(","):
            common = ["yolov8n", "-w", str(weights), "--imgsz", args.imgsz, "--precision", "int8",
                      "--calib-data", str(calib_images), "--calib-count", "16"]
            if method != "default":  # default: no --calib-method, the calibration chosen by measurement
                common += ["--calib-method", method]
            report = root / f"{method}"
            code, err, _ = enginekit("verify", *common, "--images", str(check_images), "--image-count", "24",
                                     "--data", str(check), "--report", str(report), cache=out / "cache")
            rows.append(row(name, method, False, report, code))
            print(json.dumps(rows[-1]), flush=True)
            if code == 1:
                code_b, err_b, out_b = enginekit("build", *common, "--repair", cache=out / "cache")
                repair = {}
                if code_b == 0:
                    for line in err_b.splitlines():
                        if "repair int8: the loss comes from" in line:
                            print("  " + line.strip(), flush=True)
                    manifest = json.loads((Path(out_b.strip().splitlines()[-1]).parent / "manifest.json").read_text())
                    record = manifest.get("repair") or {}
                    repair = {"kept": len(record.get("nodes", [])), "candidates": record.get("candidates"),
                              "trials": record.get("trials"), "nodes": record.get("nodes"),
                              "judged_on": record.get("judged_on"), "causes": (record.get("causes") or [])[:5],
                              "failures_before": record.get("failures_before")}
                report = root / f"{method}-repair"
                code, err, _ = enginekit("verify", *common, "--repair", "--images", str(check_images), "--image-count",
                                         "24", "--data", str(check), "--report", str(report), cache=out / "cache")
                r = row(name, method, True, report, code)
                r["build"] = code_b
                r.update(repair)
                r["build_tail"] = err_b.strip().splitlines()[-2:] if code_b else None
                rows.append(r)
                print(json.dumps(r), flush=True)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--train-into":
        _train_child(Path(sys.argv[2]), sys.argv[3])
    else:
        main()
