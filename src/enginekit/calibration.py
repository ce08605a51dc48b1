"""Calibration and reference data: photographs (a folder, a dataset YAML's train split, frames of a
video, or the embedded default) or arrays.

Its digest keys the FP16 and INT8 stages. It is computed from the files (their hashes, the
count, the shape, the family's preprocessing), not from decoded pixels, so a cache hit needs
neither an image decoder nor the model's preprocessing code. A folder or a dataset split with more
images than ``count`` gives ``count`` of them spread evenly over its sorted list (datasets are often
sequences: the first ``count`` would be near-copies); a video gives ``count`` frames sampled evenly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np

from enginekit.datasets import dataset_images, evenly, is_video, is_yaml, load_dataset, video_frames
from enginekit.errors import UsageError
from enginekit.images import embedded_image_paths, list_images, read_rgb
from enginekit.hashing import sha256_file
from enginekit.shapes import Shape, format_shape
from enginekit.fsutil import refuse_special_file



class Preprocessor(Protocol):
    """What calibration needs of a model: its family's preprocessing and how it describes its input (every
    family's adapter, ``enginekit.families.base.ModelAdapter``, is one; families sit above this module)."""

    family: str
    input_description: str

    def preprocess(self, image: np.ndarray, hw: tuple[int, int]) -> np.ndarray: ...

ARRAY_SUFFIXES = {".npy", ".npz"}


@dataclass
class CalibrationData:
    source: Path | None = None  # image folder, dataset YAML (its train split), video, .npy/.npz, or None: embedded
    count: int = 8
    skipped: list[str] = field(default_factory=list)  # "name: reason" of unreadable files
    used_paths: list[Path] = field(default_factory=list)  # images in the last batch, in order
    # Fewer readable images than this: add views of them up to it (augmented_views, below). 0: off.
    augment_to: int = 0
    #: the split of a dataset (a YAML, or with ``labelled`` a dataset folder) whose images are taken
    split: str = "train"
    #: ``source`` is a labelled dataset (``verify --data``) even where it is a folder: its ``split``'s images
    labelled: bool = False

    def __post_init__(self) -> None:
        if self.count <= 0:
            raise UsageError(f"--calib-count must be positive, not {self.count}")

    @property
    def is_array(self) -> bool:
        return self.source is not None and self.source.suffix.lower() in ARRAY_SUFFIXES

    @property
    def is_video(self) -> bool:
        return self.source is not None and is_video(self.source)

    def describe(self) -> str:
        if self.source is None:
            return f"embedded photographs (up to {self.count})"
        if is_yaml(self.source) or self.labelled:
            return f"the {self.split} split of {self.source} (up to {self.count} images, spread evenly)"
        if self.is_video:
            return f"{self.source} (up to {self.count} frames, sampled evenly)"
        return f"{self.source} (up to {self.count})"

    @cached_property
    def image_paths(self) -> list[Path]:
        """The image files used, in order (a video: the video itself)."""
        if self.source is None:
            paths = embedded_image_paths()
            if not paths:
                raise UsageError("no embedded photographs found: pass --calib-data DIR")
            return paths[: self.count]
        if not self.source.exists():
            raise UsageError(f"image folder, dataset, video or array not found: {self.source}")
        if is_yaml(self.source) or self.labelled:
            return evenly(dataset_images(load_dataset(self.source), self.split), self.count)
        if self.is_video:
            if not self.source.is_file():
                raise UsageError(f"expected a video file, not {self.source}")
            return [self.source]
        if not self.source.is_dir():
            raise UsageError(f"expected an image folder, a dataset YAML, a video or a .npy/.npz file, not {self.source}")
        return evenly(list_images(self.source), self.count)

    def digest(self, adapter: Preprocessor, shape: Shape) -> str:
        """Identity of the calibration batch this would produce at ``shape``."""
        h = hashlib.sha256()
        h.update(f"{adapter.family}|{adapter.input_description}|{format_shape(shape[1:])}|{self.count}".encode())
        if self.augment_to and not self.is_array:
            h.update(f"|views{AUGMENT_VERSION}x{self.augment_to}".encode())
        if self.is_video:
            h.update(f"|video-frames-evenly/{VIDEO_SAMPLING}".encode())
        if self.is_array:
            if not self.source.is_file():
                raise UsageError(f"image folder or array not found: {self.source}")
            h.update(sha256_file(self.source).encode())
        else:
            for p in self.image_paths:
                try:
                    h.update(sha256_file(p).encode())
                except OSError as exc:
                    raise UsageError(f"cannot read {p}: {exc.strerror}") from exc
        return h.hexdigest()

    def batch(self, adapter: Preprocessor, shape: Shape) -> np.ndarray:
        """N x C x H x W float32, preprocessed exactly as the PyTorch reference expects."""
        if self.is_array:
            return self._array_batch(shape)
        images = self.read()
        arrays = [adapter.preprocess(img, (shape[2], shape[3])) for img in images]
        return np.concatenate(arrays).astype(np.float32)

    def read(self) -> list[np.ndarray]:
        """The images (HxWx3 uint8 RGB), with views added up to ``augment_to``; ``used_paths`` and ``skipped``
        say which files they are."""
        images = []
        self.skipped, self.used_paths = [], []
        if self.is_video:
            for index, frame in video_frames(self.source, self.count):
                images.append(frame)
                self.used_paths.append(Path(f"{self.source.name}#frame{index}"))
        for p in [] if self.is_video else self.image_paths:
            img = read_rgb(p)
            if img is None:
                self.skipped.append(f"{p.name}: not a readable image")
                continue
            images.append(img)
            self.used_paths.append(p)
        if not images:
            raise UsageError(f"no readable images in {self.source or 'the embedded set'} ({len(self.skipped)} broken)")
        if self.augment_to > len(images):
            images = augmented_views(images, self.augment_to)
        return images

    def _array_batch(self, shape: Shape) -> np.ndarray:
        refuse_special_file(self.source, "calibration array")
        try:
            loaded = np.load(self.source)
            array = loaded[loaded.files[0]] if isinstance(loaded, np.lib.npyio.NpzFile) else loaded
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"cannot read calibration array {self.source}: {str(exc).splitlines()[0][:200]}") from exc
        array = np.asarray(array, dtype=np.float32)
        if array.ndim != 4 or tuple(array.shape[1:]) != tuple(shape[1:]):
            raise UsageError(
                f"calibration array {self.source} has shape {format_shape(array.shape)}; "
                f"expected Nx{format_shape(shape[1:])}"
            )
        return array[: self.count]


# -- more calibration inputs from few photographs ----------------------------------------------
# INT8 ranges come from what calibration sees; a handful of photographs shows few object sizes and
# positions. These views (flips, crops that zoom in, 2x2 mosaics that zoom out) add sizes and places
# without new pictures. Deterministic: the same images and count give the same views.

AUGMENT_VERSION = 1  # part of the calibration digest: bump when the views change
VIDEO_SAMPLING = 1  # part of the digest of a video's frames: bump when the sampling changes

# Measured (benchmarks/int8_calibration.py, 2-core CPU, ONNX Runtime CPU): the suite's trained yolov8n,
# INT8 detections at conf 0.25 vs FP32 PyTorch's (same class, IoU >= 0.5), 8 held-out shape images at
# 320x320 holding 49 FP32 detections. recall / precision / mAP50, calibration seconds:
#   set (inputs)            entropy                    max
#   photos8 (8, default)    0.939 0.958 0.993  193 s   0.980 0.980 0.994  12.5 s
#   photos8 + views (32)    0.939 0.979 0.993  164 s   0.959 1.000 0.995  25.6 s
#   shapes8 (8, a folder)   0.980 0.980 0.994   45 s   0.980 1.000 0.995   9.2 s
#   shapes2 + views (32)    0.980 0.980 0.994  148 s   0.980 1.000 0.995  20.4 s
#   shapes8 + views (32)    0.980 0.980 0.994  124 s   0.980 1.000 0.995  32.6 s
# At 640x640 (8 held-out images, 91 FP32 detections):
#   photos8 (8, default)    0.989 0.978 0.989   86 s   1.000 0.989 0.995  50 s (incl. ModelOpt import)
#   photos8 + views (32)    1.000 0.978 0.995   97 s   1.000 0.989 0.995  71 s
# Seconds are from a busy shared CPU: compare within a column only.
# Views gave no measurable gain here (every row is within 2 of 49 detections) and cost calibration
# time, so augment_to stays 0 by default; the method matters more: max kept as many or more FP32
# detections than entropy in every set, at 5-15x less calibration time (ModelOpt 0.47 offers only
# entropy and max for INT8: no percentile).


def augmented_views(images: list[np.ndarray], count: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` HxWx3 uint8 views of ``images``: the originals first, then flips, crops and mosaics."""
    import cv2

    if not images or count <= len(images):
        return list(images[:count])
    rng = np.random.default_rng(seed)
    views = list(images)
    kinds = ("flip", "crop", "mosaic", "crop-flip")
    flips = 0
    while len(views) < count:
        kind = kinds[(len(views) - len(images)) % len(kinds)]
        if kind == "flip" and flips >= len(images):  # each image is flipped once; then crops
            kind = "crop"
        img = images[int(rng.integers(len(images)))]
        h, w = img.shape[:2]
        if kind == "flip":
            view, flips = images[flips][:, ::-1], flips + 1
        elif kind in ("crop", "crop-flip"):
            side = rng.uniform(0.4, 0.8)  # zoom in: objects 1.25x to 2.5x larger after resizing
            ch, cw = max(8, int(h * side)), max(8, int(w * side))
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            view = img[y:y + ch, x:x + cw]
            view = view[:, ::-1] if kind == "crop-flip" else view
        else:  # zoom out: four images (or flips of them) at half size in one frame
            tiles = [images[int(rng.integers(len(images)))] for _ in range(4)]
            tiles = [cv2.resize(t, (w // 2, h // 2), interpolation=cv2.INTER_AREA) for t in tiles]
            view = np.concatenate([np.concatenate(tiles[:2], 1), np.concatenate(tiles[2:], 1)], 0)
        views.append(np.ascontiguousarray(view))
    return views
