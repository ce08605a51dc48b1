"""Labelled datasets as Ultralytics lays them out, and videos: where calibration and verify read images from.

- a dataset YAML (Ultralytics' keys: ``path``, ``train``, ``val``, ``test``, ``names``, ``kpt_shape``...): each
  split is a folder (read recursively), an image list ``.txt`` (one path a line, ``./`` relative to the list)
  or a list of either, relative to ``path`` (itself relative to the working directory, else to the YAML's
  folder); labels are found as Ultralytics finds them (``/images/`` -> ``/labels/``, ``.txt``);
- a folder: its images (recursively) are one split; for a classifier, a folder holding ``train``/``val``
  folders of one folder per class (Ultralytics' classify layout) is the dataset;
- a video: frames sampled evenly (``video_frames``).

Resolved without importing Ultralytics (no download is ever tried: a missing folder is one line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enginekit.errors import UsageError
from enginekit.fsutil import read_text, refuse_special_file
from enginekit.images import IMAGE_SUFFIXES

YAML_SUFFIXES = (".yaml", ".yml")
VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".asf", ".ts"}
SPLITS = ("train", "val", "test")
DATASET_YAML_LIMIT = 16 * 2**20  # a dataset YAML names its folders and classes: kilobytes


def is_yaml(path: Path) -> bool:
    return Path(path).suffix.lower() in YAML_SUFFIXES


def is_video(path: Path) -> bool:
    return Path(path).suffix.lower() in VIDEO_SUFFIXES


@dataclass
class Dataset:
    """A resolved dataset: where it is, its class names, and each split's spec (not yet listed)."""

    source: Path  # the YAML or the folder given
    root: Path
    names: dict[int, str] = field(default_factory=dict)
    splits: dict[str, Any] = field(default_factory=dict)  # split -> spec as written (str or list)
    options: dict[str, Any] = field(default_factory=dict)  # the YAML's other keys (kpt_shape, flip_idx...)
    #: a folder of class folders per split (Ultralytics' classify layout)
    classify_layout: bool = False

    @property
    def label(self) -> str:
        return self.source.name

    def images(self, split: str) -> list[Path]:
        """The split's image files, sorted; one line naming the split where it has none."""
        if split not in self.splits:
            have = ", ".join(sorted(self.splits)) or "none"
            raise UsageError(f"{self.source} has no {split} split (it has {have})")
        paths: list[Path] = []
        for item in self.splits[split] if isinstance(self.splits[split], (list, tuple)) else [self.splits[split]]:
            paths.extend(_listed(self.root, str(item), f"{self.source}: {split}"))
        paths = sorted(dict.fromkeys(paths))
        if not paths:
            raise UsageError(f"the {split} split of {self.source} has no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        return paths

    def class_folders(self, split: str) -> list[tuple[Path, int]]:
        """Classify layout: (image, class index) of a split, classes in sorted folder order."""
        folder = self.root / split
        if not folder.is_dir():
            raise UsageError(f"{self.source} has no {split} folder")
        classes = sorted(p for p in folder.iterdir() if p.is_dir())
        out = []
        for index, cls in enumerate(classes):
            out.extend((p, index) for p in image_files(cls))
        if not out:
            raise UsageError(f"the {split} split of {self.source} has no images in class folders")
        return out


def image_files(folder: Path) -> list[Path]:
    """The image files under ``folder``, sorted. One named like an image that is a FIFO, a device or a socket is
    refused (one line), not skipped: leaving it out would change what the split holds without a word."""
    found = []
    for f in sorted(folder.rglob("*")):
        if f.suffix.lower() not in IMAGE_SUFFIXES or f.is_dir():
            continue
        refuse_special_file(f, "image")
        found.append(f)
    return found


def _listed(root: Path, spec: str, what: str) -> list[Path]:
    p = Path(spec).expanduser()
    if not p.is_absolute():
        p = root / p
    refuse_special_file(p, what)
    if p.is_dir():
        return image_files(p)
    if p.is_file() and p.suffix.lower() == ".txt":
        try:
            lines = [line.strip() for line in read_text(p, what=f"{what}: image list").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{what}: cannot read the image list {p}: {exc}") from exc
        out = []
        for line in lines:
            f = Path(line[2:]) if line.startswith("./") else Path(line)
            f = f if f.is_absolute() else p.parent / f
            if f.suffix.lower() in IMAGE_SUFFIXES:
                out.append(f)
        return out
    if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES:
        return [p]
    raise UsageError(f"{what}: {p} is not a folder, an image list (.txt) or an image")


def dataset_images(dataset: Dataset, split: str) -> list[Path]:
    """Every image of ``split``, sorted: its image files, or those of its class folders (classify layout)."""
    if not dataset.classify_layout:
        return dataset.images(split)
    paths = sorted(p for p, _ in dataset.class_folders(split))  # (image, class index) pairs
    if not paths:
        raise UsageError(f"the {split} split of {dataset.source} has no images")
    return paths


def load_dataset(path: Path | str) -> Dataset:
    """A dataset YAML or a folder, resolved; one ``UsageError`` line for anything missing or malformed."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UsageError(f"dataset not found: {path}")
    if path.is_dir():
        if all((path / s).is_dir() for s in ("train", "val")) and _has_class_folders(path / "val"):
            return Dataset(path, path, {}, {s: s for s in SPLITS if (path / s).is_dir()}, classify_layout=True)
        if (path / "images").is_dir() and any((path / "images" / s).is_dir() for s in SPLITS):  # Ultralytics' layout
            return Dataset(path, path, {}, {s: f"images/{s}" for s in SPLITS if (path / "images" / s).is_dir()})
        return Dataset(path, path, {}, {"val": ".", "train": "."})  # one folder of images: every split
    if not is_yaml(path):
        raise UsageError(f"expected a dataset YAML or a folder of images, not {path}")
    import yaml

    try:
        data = yaml.safe_load(read_text(path, limit=DATASET_YAML_LIMIT, what="dataset"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read dataset {path}: {str(exc).splitlines()[0][:160]}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not an Ultralytics dataset YAML (expected keys path, train, val, names)")
    root = _root(path, data.get("path"))
    names = _names(path, data)
    splits = {s: data[s] for s in SPLITS if data.get(s)}
    if not splits:
        raise UsageError(f"{path} names no split (train, val or test)")
    options = {k: v for k, v in data.items() if k not in (*SPLITS, "path", "names")}
    classify = all(isinstance(v, str) for v in splits.values()) and _has_class_folders(root / str(splits.get("val", "")))
    return Dataset(path, root, names, splits, options, classify_layout=classify)


def _root(yaml_path: Path, value: Any) -> Path:
    """Ultralytics' ``path``: as written (relative to the working directory), else beside the YAML."""
    if not value:
        return yaml_path.parent.resolve()
    given = Path(str(value)).expanduser()
    for candidate in (given, yaml_path.parent / given):
        if candidate.is_dir():
            return candidate.resolve()
    raise UsageError(f"{yaml_path}: path {value} is not a folder (enginekit downloads no dataset)")


MAX_CLASSES = 100_000


def _names(yaml_path: Path, data: dict) -> dict[int, str]:
    nc = data.get("nc")
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, int) or not 1 <= nc <= MAX_CLASSES):
        raise UsageError(f"{yaml_path}: nc {nc!r} is not a number of classes (1 to {MAX_CLASSES})")
    names = data.get("names")
    if isinstance(names, (list, tuple)):
        found = {i: str(n) for i, n in enumerate(names)}
    elif isinstance(names, dict):
        try:
            found = {int(k): str(v) for k, v in names.items()}
        except (TypeError, ValueError) as cause:
            raise UsageError(f"{yaml_path}: names must map class indices to names") from cause
        if found and sorted(found) != list(range(len(found))):
            raise UsageError(f"{yaml_path}: names must number the classes 0 to {len(found) - 1}, each once")
    elif names is None and nc is not None:
        return {i: f"class{i}" for i in range(nc)}
    else:
        raise UsageError(f"{yaml_path} has no names (a list or an index: name mapping)")
    if not found:
        raise UsageError(f"{yaml_path}: names is empty")
    if nc is not None and nc != len(found):
        raise UsageError(f"{yaml_path}: nc {nc} but {len(found)} names")
    return found


def _has_class_folders(folder: Path) -> bool:
    if not folder.is_dir():
        return False
    subs = [p for p in folder.iterdir() if p.is_dir()]
    return bool(subs) and not any(p.suffix.lower() in IMAGE_SUFFIXES for p in folder.iterdir() if p.is_file())


def evenly(items: list, count: int) -> list:
    """``count`` items spread evenly over ``items`` (all of them when there are no more), in order."""
    if count >= len(items):
        return list(items)
    index = np.round(np.linspace(0, len(items) - 1, count)).astype(int)
    return [items[i] for i in dict.fromkeys(index.tolist())]


# -- videos --------------------------------------------------------------------------------------------
def video_frame_count(path: Path) -> int:
    """Frames in a video, as its container says; one line where OpenCV cannot open it."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    try:
        if not cap.isOpened():
            raise UsageError(f"cannot open video {path} (OpenCV's decoders)")
        return int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
    finally:
        cap.release()


def video_frames(path: Path, count: int) -> list[tuple[int, np.ndarray]]:
    """``count`` frames sampled evenly over the video, as (frame index, HxWx3 uint8 RGB): read in order
    (``grab`` past the frames between, so the indices are exact whatever the codec's seeking)."""
    import cv2

    total = video_frame_count(path)
    wanted = evenly(list(range(total)), count) if total > 0 else list(range(count))
    cap = cv2.VideoCapture(str(path))
    frames: list[tuple[int, np.ndarray]] = []
    try:
        index, targets = 0, iter(wanted)
        target = next(targets, None)
        while target is not None:
            if not cap.grab():
                break
            if index == target:
                ok, frame = cap.retrieve()
                if ok and frame is not None:
                    frames.append((index, cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)))
                target = next(targets, None)
            index += 1
    finally:
        cap.release()
    if not frames:
        raise UsageError(f"no frame could be read from video {path}")
    return frames
