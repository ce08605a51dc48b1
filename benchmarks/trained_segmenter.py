"""A trained segmenter of the DeepLabV3 family, its FP16 and INT8 verdicts against mask labels, measured.

    .venv/bin/python benchmarks/trained_segmenter.py [--out DIR] [--methods max,entropy]

torchvision's ``lraspp_mobilenet_v3_large`` (``weights=None, weights_backbone=None``, 4 classes: background,
red square, green disc, blue triangle), trained here on generated composites: the shapes pasted on crops of
the photographs installed packages ship (Ultralytics' and scikit-image's), masks as labels, 256x256; cached
in ``~/.cache/enginekit-tests`` (keyed by this file's data and training settings), a few minutes on 2 cores.

Then, as a user runs it, per precision (and calibration method for INT8)::

    enginekit verify torchvision:lraspp_mobilenet_v3_large -w model.pth --classes 4 --size 256x256 \\
        --data check/data.yaml --precision P [--calib-data calib --calib-method M] --report R

on held-out composites (non-square: 256x352) that neither training nor calibration saw. Prints one markdown
row per run: FP32 mIoU against the labels, the precision's mIoU and its drop, pixel agreement with FP32, the
verdict. A tampered graph (two classes' weights of the last layer swapped; a tenth of a weight tensor x -3) is
verified with ``--reference`` and must fail.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

NAMES = ("background", "red square", "green disc", "blue triangle")
DATA = {"train": 480, "size": 256, "objects": (1, 4), "side_px": (36, 96), "seed": 0}
TRAIN = {"steps": 500, "batch": 8, "lr": 2e-3, "seed": 0}
CHECK = {"count": 24, "hw": (256, 352), "seed": 50_000}
CALIB = {"count": 32, "hw": (256, 256), "seed": 60_000}
MODEL = "torchvision:lraspp_mobilenet_v3_large"


def photographs() -> list[np.ndarray]:
    import cv2

    from enginekit.images import embedded_image_paths

    out = [cv2.imread(str(p))[..., ::-1] for p in embedded_image_paths()]
    try:  # scikit-image's photographs, where installed
        from skimage import data

        for name in ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry"):
            img = getattr(data, name)()
            if img.ndim == 3 and img.shape[2] == 3:
                out.append(np.ascontiguousarray(img))
    except Exception:  # noqa: BLE001 - the package's own photographs suffice
        pass
    return [np.ascontiguousarray(p) for p in out if p is not None]


def composite(rng, photos, hw, objects=DATA["objects"], side_px=DATA["side_px"]):
    """One RGB image (a crop of a photograph) with shapes pasted on it, and its class map."""
    import cv2

    h, w = hw
    photo = photos[int(rng.integers(len(photos)))]
    ph, pw = photo.shape[:2]
    scale = max(h / ph, w / pw) * float(rng.uniform(1.0, 1.8))
    big = cv2.resize(photo, (max(w, int(pw * scale)), max(h, int(ph * scale))))
    y, x = int(rng.integers(0, big.shape[0] - h + 1)), int(rng.integers(0, big.shape[1] - w + 1))
    img = np.ascontiguousarray(big[y:y + h, x:x + w])
    mask = np.zeros((h, w), np.uint8)
    colours = {1: (220, 40, 40), 2: (40, 200, 60), 3: (50, 70, 230)}
    for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
        cls = int(rng.integers(1, 4))
        s = float(rng.uniform(*side_px))
        cx, cy = float(rng.uniform(s / 2, w - s / 2)), float(rng.uniform(s / 2, h - s / 2))
        colour = tuple(int(np.clip(c + rng.uniform(-25, 25), 0, 255)) for c in colours[cls])
        layer = np.zeros((h, w), np.uint8)
        if cls == 1:
            cv2.rectangle(layer, (round(cx - s / 2), round(cy - s / 2)), (round(cx + s / 2), round(cy + s / 2)), 1, -1)
        elif cls == 2:
            cv2.circle(layer, (round(cx), round(cy)), round(s / 2), 1, -1)
        else:
            pts = np.array([[cx, cy - s / 2], [cx + s / 2, cy + s / 2], [cx - s / 2, cy + s / 2]], np.int32)
            cv2.fillPoly(layer, [pts], 1)
        img[layer > 0] = colour
        mask[layer > 0] = cls
    noise = rng.normal(0, 4, img.shape)
    return np.clip(img + noise, 0, 255).astype(np.uint8), mask


def cache_dir() -> Path:
    root = Path(os.environ.get("ENGINEKIT_TEST_DATA") or Path.home() / ".cache" / "enginekit-tests")
    import torch
    import torchvision

    key = hashlib.sha256(json.dumps([DATA, TRAIN, NAMES, MODEL, torch.__version__.split("+")[0],
                                     torchvision.__version__.split("+")[0]]).encode()).hexdigest()[:16]
    return root / f"lraspp-shapes-{key}"


def build():
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    return lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=len(NAMES))


def normalise(batch: np.ndarray):
    import torch

    x = torch.from_numpy(batch).permute(0, 3, 1, 2).float() / 255.0
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return (x - mean) / std


def miou(pred: np.ndarray, label: np.ndarray, n: int = len(NAMES)) -> float:
    conf = np.bincount(n * label.reshape(-1).astype(int) + pred.reshape(-1), minlength=n * n).reshape(n, n)
    inter = np.diag(conf)
    union = conf.sum(0) + conf.sum(1) - inter
    present = union > 0
    return float((inter[present] / union[present]).mean())


def trained(log=print) -> Path:
    """The cached model.pth (trained here if missing)."""
    import torch

    folder = cache_dir()
    weights = folder / "model.pth"
    if weights.is_file():
        return weights
    torch.manual_seed(TRAIN["seed"])
    rng = np.random.default_rng(DATA["seed"])
    photos = photographs()
    images, masks = zip(*(composite(rng, photos, (DATA["size"], DATA["size"])) for _ in range(DATA["train"])))
    images, masks = np.stack(images), np.stack(masks)
    model = build()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["lr"], weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=TRAIN["lr"], total_steps=TRAIN["steps"])
    t0 = time.time()
    for step in range(TRAIN["steps"]):
        idx = rng.choice(len(images), TRAIN["batch"], replace=False)
        batch, target = images[idx], masks[idx]
        if rng.random() < 0.5:  # flips: the shapes look alike mirrored
            batch, target = batch[:, :, ::-1], target[:, :, ::-1]
        out = model(normalise(np.ascontiguousarray(batch)))["out"]
        loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(np.ascontiguousarray(target)).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == TRAIN["steps"] - 1:
            log(f"step {step}: loss {loss.item():.3f} ({time.time() - t0:.0f} s)")
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "model.pth.tmp"
    torch.save(model.state_dict(), tmp)
    tmp.replace(weights)
    (folder / "record.json").write_text(json.dumps({"data": DATA, "train": TRAIN, "seconds": round(time.time() - t0)}))
    return weights


def write_split(folder: Path, spec: dict, masks_too: bool) -> Path:
    import cv2

    rng = np.random.default_rng(spec["seed"])
    photos = photographs()
    images = folder / "images" / "val"
    images.mkdir(parents=True, exist_ok=True)
    if masks_too:
        (folder / "masks" / "val").mkdir(parents=True, exist_ok=True)
    for i in range(spec["count"]):
        img, mask = composite(rng, photos, spec["hw"])
        cv2.imwrite(str(images / f"c{i:03d}.jpg"), img[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
        if masks_too:
            cv2.imwrite(str(folder / "masks" / "val" / f"c{i:03d}.png"), mask)
    if masks_too:
        (folder / "data.yaml").write_text(
            f"path: {folder}\nval: images/val\nnames:\n" + "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES)))
    return folder


def held_out_miou(weights: Path, check: Path) -> float:
    """The FP32 PyTorch model's mIoU on the held-out split (stretched to 256, argmax, back to the image)."""
    import cv2
    import torch

    model = build()
    model.load_state_dict(torch.load(weights, map_location="cpu"))
    model.eval()
    preds, labels = [], []
    for path in sorted((check / "images" / "val").glob("*.jpg")):
        img = cv2.imread(str(path))[..., ::-1]
        x = normalise(cv2.resize(img, (256, 256))[None])
        with torch.no_grad():
            logits = torch.nn.functional.interpolate(model(x)["out"], size=img.shape[:2], mode="bilinear",
                                                     align_corners=False)
        preds.append(logits.argmax(1)[0].numpy())
        labels.append(cv2.imread(str(check / "masks" / "val" / f"{path.stem}.png"), cv2.IMREAD_GRAYSCALE))
    return miou(np.concatenate([p.reshape(-1) for p in preds]), np.concatenate([l.reshape(-1) for l in labels]))


def verify(weights: Path, check: Path, calib: Path, precision: str, method: str | None, report: Path,
           extra=()) -> dict:
    cmd = [sys.executable, "-m", "enginekit", "verify", MODEL, "-w", str(weights), "--classes", str(len(NAMES)),
           "--size", "256x256", "--data", str(check / "data.yaml"), "--images", str(check / "images" / "val"),
           "--precision", precision, "--report", str(report), *extra]
    if method:
        cmd += ["--calib-data", str(calib / "images" / "val"), "--calib-count", str(CALIB["count"]),
                "--calib-method", method]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = {"cmd": " ".join(cmd[2:]), "code": proc.returncode, "seconds": round(time.time() - t0, 1),
           "stderr_tail": proc.stderr[-3000:]}
    path = report / "report.json"
    if path.is_file():
        out["report"] = json.loads(path.read_text())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/trained_segmenter"))
    parser.add_argument("--methods", default="max,entropy")
    parser.add_argument("--only-train", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    weights = trained(lambda s: print(s, file=sys.stderr, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    check = write_split(args.out / "check", CHECK, True)
    calib = write_split(args.out / "calib", CALIB, False)
    fp32 = held_out_miou(weights, check)
    print(f"FP32 PyTorch mIoU on {CHECK['count']} held-out composites ({CHECK['hw'][0]}x{CHECK['hw'][1]}): {fp32:.4f}",
          flush=True)
    if args.only_train:
        return
    runs = [("fp16", None)] + [("int8", m) for m in args.methods.split(",") if m]
    rows = []
    for precision, method in runs:
        r = verify(weights, check, calib, precision, method, args.out / f"report-{precision}-{method or 'none'}")
        rows.append((precision, method, r))
        print(json.dumps({k: v for k, v in r.items() if k != "report"})[:1500], file=sys.stderr, flush=True)
    (args.out / "runs.json").write_text(json.dumps([{"precision": p, "method": m, **r} for p, m, r in rows],
                                                   indent=2, default=str))


if __name__ == "__main__":
    main()
