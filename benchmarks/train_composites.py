"""Train the accuracy benchmarks' models on composed photographs (benchmarks/composites.py), on a GPU.

Each model gets its own dataset (seed, task) and a wall-clock budget; they train at once on one GPU.
The weights land in OUT as ``<name>.pt`` (split into ``<name>.pt.partNN`` pieces of ``--piece-mb`` MB
when asked), with ``<name>.json`` (settings and the validator's figures) and the data's settings, so
the same datasets can be made again anywhere with the same seeds.

    python benchmarks/train_composites.py OUT --minutes 7
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

#: name: (architecture, task, data seed, train images, val images, image size, aspect range of the frames)
MODELS = {
    "v8s-composites": ("yolov8s.yaml", "detect", 1, 2000, 200, 640, (0.75, 1.33)),
    "y11s-composites-wide": ("yolo11s.yaml", "detect", 2, 2000, 200, 640, (1.33, 1.78)),
    "y11n-seg-composites": ("yolo11n-seg.yaml", "segment", 3, 2000, 200, 640, (0.75, 1.33)),
}


def _make_data(args) -> str:
    name, root = args
    from composites import write_dataset

    arch, task, seed, train, val, imgsz, aspect = MODELS[name]
    return str(write_dataset(Path(root) / name, task=task, train=train, val=val, imgsz=imgsz, seed=seed, aspect=aspect))


def _train(name: str, data: str, out: Path, minutes: float, device: str, workers: int) -> None:
    os.environ["YOLO_OFFLINE"] = "1"
    import ultralytics.engine.trainer as trainer
    from ultralytics import YOLO

    trainer.check_amp = lambda model: True  # its check downloads a model; AMP is fine on this GPU
    trainer.BaseTrainer.read_results_csv = lambda self: {}  # kept in checkpoints only; needs polars
    arch, task, seed, train, val, imgsz, aspect = MODELS[name]
    model = YOLO(arch, task=task)
    model.train(data=data, imgsz=imgsz, epochs=200, time=minutes / 60, batch=32, device=device, workers=workers,
                project="/tmp/train-runs", name=name, exist_ok=True, plots=False, seed=seed, deterministic=False,
                verbose=False, patience=1000, cache="ram")
    best = Path("/tmp/train-runs") / name / "weights" / "best.pt"
    metrics = YOLO(str(best)).val(data=data, imgsz=imgsz, batch=1, plots=False, verbose=False, device=device)
    box = metrics.box
    figures = {"map50_95": float(box.map), "map50": float(box.map50), "precision": float(box.mp), "recall": float(box.mr)}
    if task == "segment":
        figures.update(mask_map50_95=float(metrics.seg.map), mask_map50=float(metrics.seg.map50))
    (out / f"{name}.json").write_text(json.dumps({"name": name, "architecture": arch, "task": task, "data_seed": seed,
                                                  "train_images": train, "val_images": val, "imgsz": imgsz,
                                                  "aspect": aspect, "minutes": minutes, "val_batch1": figures},
                                                 indent=1))
    (out / f"{name}.pt").write_bytes(best.read_bytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--data-root", type=Path, default=Path("/tmp/composites"))
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--piece-mb", type=int, default=0, help="split each .pt into pieces of this many MB (0: whole)")
    a = ap.parse_args()
    names = [n for n in a.models.split(",") if n]
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with mp.Pool(len(names)) as pool:
        datas = pool.map(_make_data, [(n, str(a.data_root)) for n in names])
    print(f"data: {time.time() - t0:.0f} s", flush=True)
    cores = os.cpu_count() or 4
    device = os.environ.get("TRAIN_DEVICE", "0")
    procs = [mp.Process(target=_train, args=(n, d, a.out, a.minutes, device, max(2, cores // len(names) - 1)))
             for n, d in zip(names, datas)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    for n in names:
        pt = a.out / f"{n}.pt"
        if a.piece_mb and pt.is_file():
            data = pt.read_bytes()
            step = a.piece_mb * 1_000_000
            for i in range(0, len(data), step):
                (a.out / f"{n}.pt.part{i // step:02d}").write_bytes(data[i:i + step])
            pt.unlink()
        report = a.out / f"{n}.json"
        print(n, report.read_text() if report.is_file() else "FAILED", flush=True)
    print(f"total: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
