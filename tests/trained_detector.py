"""A small detector the suite trains itself, so that gates are tested on a model whose outputs mean something.

Random YOLO weights give the anchor grid with one constant score: a comparison on them cannot fail.
This module draws images of coloured shapes with their YOLO labels (seeded, so the same bytes every
run), trains ``yolov8n`` on them with Ultralytics' own trainer on the CPU, and caches ``best.pt``
(an ordinary checkpoint written by that trainer) under a folder keyed by everything that determines
it: the drawing and training settings and the ultralytics / torch versions. A file lock makes
parallel test workers train it once. The folder is ``$ENGINEKIT_TEST_DATA``, else
``~/.cache/enginekit-tests`` (``$XDG_CACHE_HOME`` respected).

Classes: 0 red circle, 1 green square, 2 blue triangle, on muted gradient backgrounds with noise.

    python tests/trained_detector.py            # train (or find) it and print the checkpoint path
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NAMES = ("red circle", "green square", "blue triangle")
MODEL = "yolov8n"  # the name enginekit exports it by: `enginekit export yolov8n --weights best.pt`

# Everything that determines the checkpoint (with the library versions, see cache_key()).
# Bump GENERATOR when the drawing code changes.
GENERATOR = 1
DATA = {"train_images": 256, "val_images": 32, "size": 160, "objects": (1, 5), "side_px": (18, 64), "seed": 0}
TRAIN = {
    "model": f"{MODEL}.yaml",
    "imgsz": 160,
    "epochs": 12,
    "batch": 16,
    "seed": 0,
    "deterministic": True,
    "optimizer": "AdamW",
    "lr0": 0.004,
    "warmup_epochs": 1,
    "mosaic": 0.0,  # test images look like training images; mosaic would halve the shapes
    "hsv_h": 0.0,  # the hue is the class: keep it
    "fliplr": 0.5,
    "amp": False,
}
HELD_OUT_SEED = 10_000  # generated test images never share a seed with training images


@dataclass(frozen=True)
class TrainedDetector:
    weights: Path  # best.pt, as saved by Ultralytics' trainer
    names: tuple[str, ...]
    model: str  # enginekit's name for the architecture
    train_seconds: float  # how long training took when it ran (read from the cache's record)


# --------------------------------------------------------------------------------------------------- drawing


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A muted two-colour gradient with a few soft blobs and pixel noise (RGB uint8)."""
    a, b = rng.uniform(60, 200, 3), rng.uniform(60, 200, 3)
    # pull colours toward grey so no background reads as a class colour
    a, b = (a + a.mean()) / 2, (b + b.mean()) / 2
    angle = rng.uniform(0, np.pi)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    t = (np.cos(angle) * xx / w + np.sin(angle) * yy / h)
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    img = a[None, None, :] * (1 - t[..., None]) + b[None, None, :] * t[..., None]
    for _ in range(int(rng.integers(0, 4))):  # soft blobs
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        r = rng.uniform(0.1, 0.4) * min(h, w)
        g = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))
        img += g[..., None] * rng.uniform(-40, 40)
    img += rng.normal(0, rng.uniform(3, 14), img.shape)
    return np.clip(img, 0, 255)


def _colour(rng: np.random.Generator, cls: int) -> tuple[float, float, float]:
    strong, weak = rng.uniform(170, 255), rng.uniform(0, 70, 2)
    rgb = [weak[0], weak[1]]
    rgb.insert(cls, strong)  # cls 0 red, 1 green, 2 blue
    return tuple(float(c) for c in rgb)


def draw_image(rng: np.random.Generator, h: int, w: int, objects: tuple[int, int], side_px: tuple[int, int]):
    """One image and its boxes: (RGB uint8 HxWx3, [(cls, x1, y1, x2, y2) in pixels])."""
    import cv2

    img = _background(rng, h, w)
    boxes: list[tuple[int, float, float, float, float]] = []
    for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
        for _attempt in range(20):  # place without heavy overlap
            side = float(rng.uniform(*side_px))
            x1, y1 = rng.uniform(1, w - side - 1), rng.uniform(1, h - side - 1)
            box = (x1, y1, x1 + side, y1 + side)
            if all(_iou(box, other[1:]) < 0.1 for other in boxes):
                break
        else:
            continue
        cls = int(rng.integers(0, len(NAMES)))
        colour = _colour(rng, cls)
        x1, y1, x2, y2 = box
        cx, cy, s = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1
        if cls == 0:
            cv2.circle(img, (round(cx), round(cy)), round(s / 2), colour, -1, cv2.LINE_AA)
        elif cls == 1:
            cv2.rectangle(img, (round(x1), round(y1)), (round(x2), round(y2)), colour, -1, cv2.LINE_AA)
        else:
            pts = np.array([[cx, y1], [x2, y2], [x1, y2]], np.int32)
            cv2.fillPoly(img, [pts], colour, cv2.LINE_AA)
        boxes.append((cls, x1, y1, x2, y2))
    img += rng.normal(0, 4, img.shape)  # noise over the shapes too
    return np.clip(img, 0, 255).astype(np.uint8), boxes


def _iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def write_dataset(root: Path, data: dict = DATA) -> Path:
    """The Ultralytics layout (images/{train,val}, labels/{train,val}) and its data YAML; returns the YAML."""
    import cv2

    size = data["size"]
    for split, count, seed in (("train", data["train_images"], data["seed"]),
                               ("val", data["val_images"], data["seed"] + 1)):
        rng = np.random.default_rng(seed)
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            img, boxes = draw_image(rng, size, size, data["objects"], data["side_px"])
            cv2.imwrite(str(root / "images" / split / f"{i:04d}.png"), img[..., ::-1])
            lines = [f"{c} {(x1 + x2) / 2 / size:.6f} {(y1 + y2) / 2 / size:.6f} {(x2 - x1) / size:.6f} "
                     f"{(y2 - y1) / size:.6f}" for c, x1, y1, x2, y2 in boxes]
            (root / "labels" / split / f"{i:04d}.txt").write_text("\n".join(lines) + ("\n" if lines else ""))
    yaml_path = root / "shapes.yaml"
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(NAMES))
    yaml_path.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return yaml_path


def held_out_images(count: int = 4, size: int = 640, seed: int = HELD_OUT_SEED):
    """Generated test images (never seen in training) with their boxes in pixels.

    Shapes keep the pixel size they had in training (18-64 px), so a ``size`` larger than the
    training images just holds more of them: letterboxed to ``size`` they look as in training.
    """
    rng = np.random.default_rng(seed)
    scale = max(1, size // DATA["size"])
    objects = (DATA["objects"][0] * scale, DATA["objects"][1] * scale)
    return [draw_image(rng, size, size, objects, DATA["side_px"]) for _ in range(count)]


def write_held_out_images(folder: Path, count: int = 4, size: int = 640, seed: int = HELD_OUT_SEED) -> Path:
    """held_out_images() as PNG files in ``folder`` (for ``--images``); returns the folder."""
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    for i, (img, _boxes) in enumerate(held_out_images(count, size, seed)):
        cv2.imwrite(str(folder / f"shapes_{i:02d}.png"), img[..., ::-1])
    return folder


def write_test_images(folder: Path, count: int = 8, size: int = 640) -> Path:
    """A folder of ``count`` held-out shape images plus the real photographs, for ``--images``."""
    write_held_out_images(folder, count, size)
    for photo in photographs():
        shutil.copy2(photo, folder / photo.name)
    return folder


def photographs() -> list[Path]:
    """The real photographs Ultralytics installs (bus.jpg, zidane.jpg)."""
    import ultralytics

    return sorted((Path(ultralytics.__file__).parent / "assets").glob("*.jpg"))


# ------------------------------------------------------------------------------------- an INT8-hostile variant
#: the spread-outlier detector: a share of the output channels of each of the first two convolutions made ``SCALE``
#: times wider (BatchNorm weight and bias), the next convolution's weights for those channels as much narrower
OUTLIERS = {"layers": (0, 1), "share": 0.1, "scale": 24.0}


def spread_outlier_detector(weights: Path, out: Path, *, share: float = OUTLIERS["share"],
                            scale: float = OUTLIERS["scale"]) -> Path:
    """The trained detector with its INT8 loss spread over its first layers, as real detectors have it (a few
    channels whose activations are far wider than the rest of their tensor, which INT8 quantizes per tensor): in
    each of the first two convolutions, ``share`` of the output channels (the most active first, every tenth
    after) scaled ``scale`` times (BatchNorm weight and bias: SiLU is near-linear there) and the next
    convolution's weights for them scaled down as much. FP32 still detects what it did (the detector's boxes
    hardly move); default INT8 loses detections on held-out images. A checkpoint as the trainer writes one."""
    import torch

    ckpt = torch.load(weights, weights_only=False)  # the suite's own file
    model = (ckpt.get("ema") or ckpt["model"]).float()
    layers = model.model
    following = {0: layers[1].conv, 1: layers[2].cv1.conv}  # what reads each layer's output
    with torch.no_grad():
        for index in OUTLIERS["layers"]:
            block, after = layers[index], following[index]
            n = block.bn.weight.numel()
            channels = sorted(range(n), key=lambda c: -float(block.bn.bias[c]))[:max(1, round(share * n))]
            for c in channels:
                block.bn.weight[c] *= scale
                block.bn.bias[c] *= scale
                after.weight[:, c] /= scale
    ckpt["model"], ckpt["ema"] = model.half(), None
    torch.save(ckpt, out)
    return out


# --------------------------------------------------------------------------------------------------- cache


def cache_key() -> str:
    import torch
    import ultralytics

    parts = {"generator": GENERATOR, "data": DATA, "train": TRAIN, "names": NAMES,
             "ultralytics": ultralytics.__version__, "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=list).encode()).hexdigest()[:16]


def cache_root() -> Path:
    env = os.environ.get("ENGINEKIT_TEST_DATA")
    if env:
        return Path(env)
    # Outside the repository: shared by checkouts, and `pytest --cache-clear` does not retrain it.
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "enginekit-tests"


def trained_detector(root: Path | None = None) -> TrainedDetector:
    """The cached checkpoint, training it first (once, under a lock) where it is missing."""
    from filelock import FileLock

    entry = (root or cache_root()) / f"{MODEL}-shapes-{cache_key()}"
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        if not (entry / "record.json").exists():
            _train_into(entry)
    record = json.loads((entry / "record.json").read_text())
    return TrainedDetector(entry / "best.pt", tuple(record["names"]), MODEL, record["train_seconds"])


def _train_into(entry: Path) -> None:
    """Train in a child process (the trainer changes process-wide state) into a temp folder, then rename."""
    work = entry.with_name(entry.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = dict(os.environ, YOLO_OFFLINE="1", YOLO_VERBOSE="False", YOLO_CONFIG_DIR=str(work / "config"))
    start, cpu_start = time.perf_counter(), _children_cpu_seconds()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--train-into", str(work)], env=env,
                          capture_output=True, text=True)
    seconds, cpu_seconds = time.perf_counter() - start, _children_cpu_seconds() - cpu_start
    if proc.returncode != 0 or not (work / "best.pt").exists():
        raise RuntimeError(f"training the test detector failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    (work / "record.json").write_text(json.dumps({"names": list(NAMES), "train_seconds": round(seconds, 1),
                                                  "train_cpu_seconds": round(cpu_seconds, 1),
                                                  "key": cache_key(), "data": DATA, "train": TRAIN}, indent=1))
    for scratch in ("runs", "dataset", "config"):  # the data is regenerated by write_dataset() on demand
        shutil.rmtree(work / scratch, ignore_errors=True)
    shutil.rmtree(entry, ignore_errors=True)
    work.rename(entry)


def _children_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _train_child(work: Path) -> None:
    import ultralytics.data.utils as data_utils
    from ultralytics import YOLO

    # The dataset check fetches a font for plots; with plots off nothing uses it, and offline it only waits.
    data_utils.check_font = lambda *a, **k: None
    yaml_path = write_dataset(work / "dataset")
    settings = {k: v for k, v in TRAIN.items() if k != "model"}
    model = YOLO(TRAIN["model"])
    model.train(data=str(yaml_path), device="cpu", workers=0, plots=False, val=False, project=str(work / "runs"),
                name="train", exist_ok=True, verbose=False, **settings)
    best = work / "runs" / "train" / "weights" / "best.pt"
    shutil.copy2(best, work / "best.pt")


# ------------------------------------------------------------------------------------------- quantization-aware

#: the QAT fine-tune of the trained detector, as a user runs it: ``YOLO(best.pt).train(..., quantize=8)``
QAT_TRAIN = {"epochs": 2, "lr0": 0.0005, "warmup_epochs": 0, "quantize": 8}


def qat_detector(root: Path | None = None) -> Path:
    """The trained detector fine-tuned quantization-aware by Ultralytics' trainer (``quantize=8``, through ModelOpt:
    INT8 fake quantizers with calibrated ranges, two epochs at a small learning rate): its ``best.pt``, a checkpoint
    that keeps the model without quantizers and ModelOpt's state beside it under ``"modelopt"``. Cached like the
    detector, keyed by it and ModelOpt's version."""
    from importlib.metadata import version

    from filelock import FileLock

    base = trained_detector(root)
    parts = {"base": cache_key(), "train": QAT_TRAIN, "modelopt": version("nvidia-modelopt")}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    entry = (root or cache_root()) / f"{MODEL}-shapes-qat-{key}"
    with FileLock(str(entry) + ".lock"):
        if not (entry / "best.pt").exists():
            work = entry.with_name(entry.name + f".tmp{os.getpid()}")
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            env = dict(os.environ, YOLO_OFFLINE="1", YOLO_VERBOSE="False", YOLO_CONFIG_DIR=str(work / "config"))
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--qat-into", str(work),
                                   str(base.weights)], env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not (work / "best.pt").exists():
                raise RuntimeError(f"QAT fine-tuning of the test detector failed ({proc.returncode}):\n"
                                   f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            for scratch in ("runs", "dataset", "config"):
                shutil.rmtree(work / scratch, ignore_errors=True)
            shutil.rmtree(entry, ignore_errors=True)
            work.rename(entry)
    return entry / "best.pt"


def _qat_child(work: Path, weights: Path) -> None:
    import ultralytics.data.utils as data_utils
    from ultralytics import YOLO

    data_utils.check_font = lambda *a, **k: None
    yaml_path = write_dataset(work / "dataset")
    settings = {k: v for k, v in TRAIN.items() if k not in ("model", *QAT_TRAIN)}
    YOLO(str(weights)).train(data=str(yaml_path), device="cpu", workers=0, plots=False, val=False,
                             project=str(work / "runs"), name="train", exist_ok=True, verbose=False,
                             **settings, **QAT_TRAIN)
    shutil.copy2(work / "runs" / "train" / "weights" / "best.pt", work / "best.pt")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--train-into":
        _train_child(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--qat-into":
        _qat_child(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        found = trained_detector()
        print(found.weights, f"(trained in {found.train_seconds} s)")
