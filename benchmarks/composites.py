"""Labelled photographs for accuracy work: objects cut from real photographs, pasted on real backgrounds.

The suite's own trained models see coloured shapes on noise: easy data, whose activations stay in a
narrow range. Accuracy figures that users quote come from models trained on photographs. The project's
benchmarks download nothing, so this script composes labelled ones from the photographs that ship with
scikit-image and Ultralytics: nine object classes (faces, coins, a cat, a cup, a rocket, a person, a
motorcycle, a horse, a logo), each cut with its own mask, pasted at many scales with flips, small
rotations, colour and blur jitter, partial occlusion and unlabelled distractor patches, on crops of
textures and scenes. It writes an Ultralytics dataset (images/, labels/, data.yaml) for detection or
segmentation (polygons of the visible part of each object).

    python benchmarks/composites.py OUT --task detect --train 2000 --val 200 --imgsz 640 --seed 1
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

NAMES = ["face", "coin", "cat", "cup", "rocket", "person", "motorcycle", "horse", "logo"]


@dataclass
class Sprite:
    cls: int
    rgb: np.ndarray  # h x w x 3 uint8
    mask: np.ndarray  # h x w uint8 (0/255)


def _data_dir() -> Path:
    import skimage.data

    return Path(os.path.dirname(skimage.data.__file__))


def _assets_dir() -> Path:
    import ultralytics

    return Path(ultralytics.__file__).parent / "assets"


def _read(name: str, flags=cv2.IMREAD_COLOR) -> np.ndarray:
    path = _data_dir() / name
    img = cv2.imread(str(path), flags)
    if img is None:
        raise FileNotFoundError(path)
    return img


def _ellipse(h: int, w: int, shrink: float = 0.96) -> np.ndarray:
    m = np.zeros((h, w), np.uint8)
    cv2.ellipse(m, (w // 2, h // 2), (max(1, int(w * shrink / 2)), max(1, int(h * shrink / 2))), 0, 0, 360, 255, -1)
    return m


def _rounded(h: int, w: int, r: float = 0.15) -> np.ndarray:
    m = np.zeros((h, w), np.uint8)
    rad = max(1, int(min(h, w) * r))
    cv2.rectangle(m, (rad, 0), (w - rad, h), 255, -1)
    cv2.rectangle(m, (0, rad), (w, h - rad), 255, -1)
    for cx, cy in ((rad, rad), (w - rad, rad), (rad, h - rad), (w - rad, h - rad)):
        cv2.circle(m, (cx, cy), rad, 255, -1)
    return m


def sprites() -> list[Sprite]:
    """Every labelled object the scenes are made of."""
    out: list[Sprite] = []
    faces = np.load(_data_dir() / "lfw_subset.npy")  # 200 x 25 x 25 grey faces
    tint = np.array([0.78, 0.86, 1.0])  # BGR skin tone
    for f in faces[:100]:  # the first 100 are faces, the rest are not
        g = cv2.resize((f * 255).astype(np.uint8), (50, 50), interpolation=cv2.INTER_CUBIC)
        rgb = np.clip(g[..., None] * tint[None, None], 0, 255).astype(np.uint8)
        out.append(Sprite(0, rgb, _ellipse(50, 50, 0.9)))
    coins = _read("coins.png", cv2.IMREAD_GRAYSCALE)
    _, bw = cv2.threshold(cv2.GaussianBlur(coins, (5, 5), 0), 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    n, lab, stats, _ = cv2.connectedComponentsWithStats(bw)
    for i in range(1, n):
        x, y, w, h, area = stats[i]
        if area < 300 or w < 15 or h < 15:
            continue
        mask = (lab[y:y + h, x:x + w] == i).astype(np.uint8) * 255
        patch = coins[y:y + h, x:x + w]
        rgb = np.clip(patch[..., None] * np.array([0.55, 0.75, 0.95])[None, None], 0, 255).astype(np.uint8)
        out.append(Sprite(1, rgb, mask))
    crops = {  # class: (file, y0, y1, x0, x1, mask kind)
        2: ("chelsea.png", 20, 290, 110, 380, "ellipse"),
        3: ("coffee.png", 20, 380, 100, 520, "ellipse"),
        4: ("rocket.jpg", 30, 427, 260, 400, "rounded"),
        5: ("astronaut.png", 0, 512, 60, 470, "ellipse"),
        6: ("motorcycle_left.png", 40, 480, 20, 720, "rounded"),
    }
    for cls, (name, y0, y1, x0, x1, kind) in crops.items():
        img = _read(name)[y0:y1, x0:x1]
        h, w = img.shape[:2]
        out.append(Sprite(cls, img, _ellipse(h, w) if kind == "ellipse" else _rounded(h, w)))
    horse = _read("horse.png", cv2.IMREAD_UNCHANGED)
    sil = (horse[..., :3].mean(-1) < 128).astype(np.uint8) * 255 if horse.ndim == 3 else (horse < 128).astype(np.uint8) * 255
    ys, xs = np.nonzero(sil)
    sil = sil[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    for tex in ("brick.png", "gravel.png"):
        t = cv2.resize(_read(tex), (sil.shape[1], sil.shape[0]))
        out.append(Sprite(7, np.clip(t * np.array([0.45, 0.6, 0.85]), 0, 255).astype(np.uint8), sil))
    logo = _read("logo.png", cv2.IMREAD_UNCHANGED)
    alpha = logo[..., 3]
    ys, xs = np.nonzero(alpha > 128)
    box = (slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))
    out.append(Sprite(8, logo[..., :3][box].copy(), ((alpha[box] > 128) * 255).astype(np.uint8)))
    return out


def backgrounds() -> list[np.ndarray]:
    names = ["brick.png", "grass.png", "gravel.png", "hubble_deep_field.jpg", "moon.png", "camera.png", "retina.jpg",
             "ihc.png", "page.png", "text.png", "cell.png", "clock_motion.png", "color.png", "microaneurysms.png"]
    imgs = [_read(n) for n in names]
    imgs += [cv2.imread(str(p)) for p in sorted(_assets_dir().glob("*.jpg"))]
    return [i for i in imgs if i is not None]


def _background(rng: np.random.Generator, bgs: list[np.ndarray], h: int, w: int) -> np.ndarray:
    src = bgs[rng.integers(len(bgs))]
    sh, sw = src.shape[:2]
    scale = rng.uniform(0.4, 1.0)
    ch, cw = max(8, int(sh * scale)), max(8, int(sw * scale))
    y, x = rng.integers(0, sh - ch + 1), rng.integers(0, sw - cw + 1)
    img = cv2.resize(src[y:y + ch, x:x + cw], (w, h), interpolation=cv2.INTER_LINEAR).astype(np.float32)
    img = img * rng.uniform(0.6, 1.3, size=3)[None, None] + rng.uniform(-30, 30)
    if rng.random() < 0.5:  # a second texture blended in
        other = cv2.resize(bgs[rng.integers(len(bgs))], (w, h)).astype(np.float32)
        a = rng.uniform(0.2, 0.5)
        img = img * (1 - a) + other * a
    return np.clip(img, 0, 255).astype(np.uint8)


def _transform(rng: np.random.Generator, s: Sprite, side: int) -> tuple[np.ndarray, np.ndarray]:
    h, w = s.rgb.shape[:2]
    aspect = rng.uniform(0.8, 1.25)
    scale = side / max(h, w)
    nh, nw = max(4, int(h * scale * aspect)), max(4, int(w * scale / aspect))
    rgb = cv2.resize(s.rgb, (nw, nh), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    mask = cv2.resize(s.mask, (nw, nh), interpolation=cv2.INTER_NEAREST)
    if rng.random() < 0.5:
        rgb, mask = rgb[:, ::-1], mask[:, ::-1]
    angle = rng.uniform(-15, 15)
    if abs(angle) > 2:
        diag = int(np.ceil(np.hypot(nh, nw)))
        M = cv2.getRotationMatrix2D((nw / 2, nh / 2), angle, 1.0)
        M[:, 2] += ((diag - nw) / 2, (diag - nh) / 2)
        rgb = cv2.warpAffine(np.ascontiguousarray(rgb), M, (diag, diag), flags=cv2.INTER_LINEAR)
        mask = cv2.warpAffine(np.ascontiguousarray(mask), M, (diag, diag), flags=cv2.INTER_NEAREST)
        ys, xs = np.nonzero(mask)
        if len(ys):
            rgb, mask = rgb[ys.min():ys.max() + 1, xs.min():xs.max() + 1], mask[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    rgb = rgb.astype(np.float32) * rng.uniform(0.7, 1.3) + rng.uniform(-25, 25)
    if rng.random() < 0.25:
        k = int(rng.choice([3, 5]))
        rgb = cv2.GaussianBlur(rgb, (k, k), 0)
    return np.clip(rgb, 0, 255).astype(np.uint8), np.ascontiguousarray(mask)


def scene(rng: np.random.Generator, sp: list[Sprite], bgs: list[np.ndarray], h: int, w: int):
    """One image and its objects: (image, [(class, visible mask in image pixels)])."""
    img = _background(rng, bgs, h, w)
    owner = np.full((h, w), -1, np.int32)  # which pasted object each pixel shows
    objects: list[tuple[int, int, int]] = []  # (class, paste index, pixels pasted)
    n = int(rng.integers(2, 13))
    for k in range(n):
        distractor = rng.random() < 0.2
        side = int(min(h, w) * np.exp(rng.uniform(np.log(0.05), np.log(0.45))))
        if distractor:  # an unlabelled patch of texture
            src = bgs[rng.integers(len(bgs))]
            y, x = rng.integers(0, src.shape[0] - 16), rng.integers(0, src.shape[1] - 16)
            patch = src[y:y + 64, x:x + 64]
            s = Sprite(-1, patch, _ellipse(*patch.shape[:2]) if rng.random() < 0.5 else _rounded(*patch.shape[:2]))
        else:  # a class first, then one of its sprites: faces and coins are many, the rest one or two
            cls = int(rng.integers(len(NAMES)))
            of_class = [x for x in sp if x.cls == cls]
            s = of_class[rng.integers(len(of_class))]
        rgb, mask = _transform(rng, s, max(8, side))
        ph, pw = mask.shape
        if ph >= h or pw >= w:
            continue
        y, x = int(rng.integers(0, h - ph)), int(rng.integers(0, w - pw))
        m = mask > 127
        region = img[y:y + ph, x:x + pw]
        soft = cv2.GaussianBlur(mask.astype(np.float32) / 255.0, (3, 3), 0)[..., None]
        region[:] = np.clip(region * (1 - soft) + rgb * soft, 0, 255).astype(np.uint8)
        owner[y:y + ph, x:x + pw][m] = len(objects) if not distractor else -2 - k
        if not distractor:
            objects.append((s.cls, len(objects), int(m.sum())))
    if rng.random() < 0.3:
        img = np.clip(img.astype(np.float32) + rng.normal(0, rng.uniform(2, 8), img.shape), 0, 255).astype(np.uint8)
    found = []
    for cls, idx, pasted in objects:
        vis = (owner == idx).astype(np.uint8)
        if vis.sum() < 0.4 * pasted or vis.sum() < 40:  # mostly hidden by later objects: not labelled
            continue
        found.append((cls, vis))
    return img, found


def _polygon(mask: np.ndarray) -> np.ndarray | None:
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    if not contours:
        return None
    c = max(contours, key=cv2.contourArea)
    c = cv2.approxPolyDP(c, 1.0, True).reshape(-1, 2)
    return c if len(c) >= 3 else None


def write_dataset(root: Path, *, task: str = "detect", train: int = 2000, val: int = 200, imgsz: int = 640,
                  seed: int = 0, aspect: tuple[float, float] = (0.75, 1.33)) -> Path:
    """An Ultralytics dataset under ``root``; returns its data.yaml. Images are not all square."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    sp, bgs = sprites(), backgrounds()
    for split, count in (("train", train), ("val", val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            ratio = rng.uniform(*aspect)
            h, w = (imgsz, int(imgsz * ratio)) if ratio >= 1 else (int(imgsz / ratio), imgsz)
            h, w = min(h, int(imgsz * 1.4)), min(w, int(imgsz * 1.4))
            img, objs = scene(rng, sp, bgs, h, w)
            lines = []
            for cls, vis in objs:
                if task == "segment":
                    poly = _polygon(vis)
                    if poly is None:
                        continue
                    coords = " ".join(f"{x / w:.5f} {y / h:.5f}" for x, y in poly)
                    lines.append(f"{cls} {coords}")
                else:
                    ys, xs = np.nonzero(vis)
                    x0, x1, y0, y1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1
                    lines.append(f"{cls} {(x0 + x1) / 2 / w:.6f} {(y0 + y1) / 2 / h:.6f} {(x1 - x0) / w:.6f} {(y1 - y0) / h:.6f}")
            name = f"{split}_{i:05d}"
            cv2.imwrite(str(root / "images" / split / f"{name}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 92])
            (root / "labels" / split / f"{name}.txt").write_text("\n".join(lines) + ("\n" if lines else ""))
    yaml = root / "data.yaml"
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(NAMES))
    yaml.write_text(f"path: {root.resolve()}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return yaml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--task", choices=("detect", "segment"), default="detect")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--val", type=int, default=200)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(write_dataset(a.out, task=a.task, train=a.train, val=a.val, imgsz=a.imgsz, seed=a.seed))


if __name__ == "__main__":
    main()
