"""Labels for declared PyTorch models (``verify --data``): class maps for semantic models, class folders for
classifiers, with the dataset's classes mapped to the model's by name.

Semantic: a labelled split as users keep it, one of
- **mask images**: per image a PNG of class indices at the image's size (a palette or greyscale PNG, as VOC's
  ``SegmentationClass``; 255 = ignore), found as Ultralytics finds label files with ``masks`` for ``images``:
  ``masks/<split>/<stem>.png`` beside ``images/<split>`` (VOC's ``JPEGImages`` -> ``SegmentationClass`` too);
- **an Ultralytics segment dataset**: YOLO polygon labels (read by Ultralytics), each image's polygons filled
  in file order into one class map at the image's size (a later polygon over an earlier one); pixels under no
  polygon are *unlabelled*.
A split where any image has a mask is read as masks (images without one are left out, and said so); else as
polygons.

Classes (``class_mapping``): where both the dataset (its YAML's ``names``) and the model (the table's names,
e.g. VOC's for torchvision's segmentation models) name their classes, a dataset class is the model class of
the same name (case, spaces and ``_`` aside); dataset classes no model class is named as are ignored (said
so), and none matching is refused. Unlabelled pixels are the model's class named ``background``; where it
has none, its class 0 when the model has exactly one class more than the dataset and class 0 matched none;
else they are ignored. Where one side has no names, classes are matched by index (dataset class i is model
class i), or shifted by one (class 0 for unlabelled pixels) where the model has one class more than the
dataset.

Classify: Ultralytics' folder-per-class layout, each folder the model class of its name; where the model
names no class, the folders in sorted order are its classes 0, 1, ... (Ultralytics' ``ImageFolder``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginekit.datasets import Dataset, evenly
from enginekit.errors import UsageError
from enginekit.families.ultralytics.labels import LabelledSplit, Sample, _ultralytics_labels
from enginekit.fsutil import open_regular
from enginekit.hashing import sha256_file

#: part of every ground-truth key: bump when reading, rasterising or mapping labels changes
SEMANTIC_LABELS_VERSION = 1
IGNORE = -1  # a pixel no class is scored on
MASK_IGNORE = 255  # VOC's: the value of a mask pixel to ignore
BACKGROUND = "background"
#: where masks lie for images in a folder named as the key
MASK_FOLDERS = (("images", "masks"), ("JPEGImages", "SegmentationClass"))


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", str(name).lower())


def _few(names: dict[int, str], count: int = 6) -> str:
    items = [names[k] for k in sorted(names)]
    return ", ".join(items[:count]) + (f", ... ({len(items)})" if len(items) > count else "")


@dataclass(frozen=True)
class ClassMapping:
    """Dataset class -> model class (a class absent from ``table`` is ignored); ``unlabelled``: the model class
    of pixels no label covers (``IGNORE``: ignored); ``how``: ``name``, ``index`` or ``index+1``."""

    table: dict[int, int]
    unlabelled: int
    how: str
    notes: tuple[str, ...] = ()

    def lut(self, size: int) -> np.ndarray:
        out = np.full(max(size, 1), IGNORE, np.int64)
        for d, m in self.table.items():
            if 0 <= d < size:
                out[d] = m
        return out

    def describe(self) -> str:
        return f"{self.how}:{sorted(self.table.items())}:{self.unlabelled}"


def class_mapping(dataset_names: dict[int, str], model_names: dict[int, str], model_count: int | None, *,
                  source: str = "the dataset", model: str = "the model") -> ClassMapping | None:
    """How the dataset's classes become the model's (module docstring); None where it depends on the model's
    class count and that is not known yet (no names; its first output says)."""
    if model_names:
        model_count = len(model_names)
    by_name: dict[str, int] = {}
    for index in sorted(model_names):
        by_name.setdefault(_norm(model_names[index]), index)
    background = by_name.get(BACKGROUND)
    if dataset_names and model_names:
        table = {d: by_name[_norm(n)] for d, n in dataset_names.items() if _norm(n) in by_name}
        if not table:
            raise UsageError(f"no class of {source} ({_few(dataset_names)}) is a class of {model} "
                             f"({_few(model_names)}): classes are matched by name")
        notes = []
        left = [dataset_names[d] for d in sorted(dataset_names) if d not in table]
        if left:
            notes.append(f"{len(left)} class(es) of {source} are no class of {model} and are ignored: "
                         + ", ".join(left[:8]))
        if background is None and len(model_names) == len(dataset_names) + 1 and 0 not in table.values():
            background = 0
        return ClassMapping(table, IGNORE if background is None else background, "name", tuple(notes))
    if model_count is None:
        return None
    count = len(dataset_names)
    if dataset_names and model_count == count + 1:
        return ClassMapping({d: d + 1 for d in dataset_names}, 0, "index+1",
                            (f"{model} names no class: {source}'s classes are its classes 1..{count}, unlabelled "
                             "pixels its class 0",))
    if dataset_names and model_count != count:
        raise UsageError(f"{source} has {count} classes and {model} {model_count}, named nowhere: classes are "
                         "matched by index where the model has as many classes as the dataset (or one more, "
                         "class 0 for unlabelled pixels)")
    notes = () if not dataset_names else (f"{model} names no class: {source}'s classes are matched by index",)
    return ClassMapping({i: i for i in range(model_count)}, IGNORE if background is None else background, "index",
                        notes)


# -- semantic --------------------------------------------------------------------------------------------
@dataclass
class SemanticSample:
    """One labelled image: its file and its labels (a mask file, or Ultralytics' polygons)."""

    path: Path
    mask: Path | None = None
    classes: np.ndarray | None = None  # polygons: each one's dataset class
    polygons: list = field(default_factory=list)  # polygons: (n, 2) normalised x, y
    hw: tuple[int, int] | None = None  # the image's H x W as read
    label: None = None  # no Ultralytics label dict: every frame goes to the network size


@dataclass
class SemanticSplit:
    """A split's images and class-map labels for a semantic model (what ``verify.ground_truth`` scores)."""

    dataset: Dataset
    split: str
    samples: list[SemanticSample]
    names: dict[int, str]  # the dataset's classes
    mapping: ClassMapping | None
    model_names: dict[int, str]
    model_count: int | None
    kind: str  # "masks" | "polygons"
    labelled_pixels: int = 0
    notes: list[str] = field(default_factory=list)
    task = "semantic"
    max_labels = 0

    @property
    def instances(self) -> int:
        """Labelled pixels (the ``instances`` of a semantic split)."""
        return self.labelled_pixels

    def digest(self) -> str:
        """Every image's and label's content, the classes and how they map to the model's."""
        h = hashlib.sha256(f"semantic-labels/{SEMANTIC_LABELS_VERSION}|{self.kind}|{sorted(self.names.items())}|"
                           f"{sorted(self.model_names.items())}|{self.model_count}|"
                           f"{self.mapping.describe() if self.mapping else None}".encode())
        for s in self.samples:
            h.update(sha256_file(s.path).encode())
            if s.mask is not None:
                h.update(sha256_file(s.mask).encode())
            else:
                h.update(repr((s.classes.ravel().tolist(),
                               [np.round(p, 6).ravel().tolist() for p in s.polygons])).encode())
        return h.hexdigest()

    def resolved(self, channels: int) -> ClassMapping:
        """The mapping, given the model's class count where it was not known (its first output's channels)."""
        if self.mapping is not None:
            return self.mapping
        return class_mapping(self.names, self.model_names, channels, source=self.dataset.label)

    def truth(self, sample: SemanticSample, image_hw: tuple[int, int], channels: int) -> np.ndarray:
        """The sample's class map at ``image_hw`` in the model's classes (``IGNORE``: not scored)."""
        mapping = self.resolved(channels)
        if sample.mask is not None:
            values = read_mask(sample.mask)
            if values.shape != tuple(image_hw):
                raise UsageError(f"mask {sample.mask} is {values.shape[1]}x{values.shape[0]}, its image "
                                 f"{sample.path.name} {image_hw[1]}x{image_hw[0]}: a mask is at its image's size")
            if not self.names:  # values are the model's classes: one it has not is refused, not ignored
                strange = sorted(set(np.unique(values).tolist()) - set(mapping.table) - {MASK_IGNORE})
                if strange:
                    raise UsageError(f"mask {sample.mask} holds value {strange[0]}, no class of the model "
                                     f"({channels} classes; values are class indices, 255 is ignored)")
            lut = mapping.lut(int(values.max()) + 1)
            out = lut[values]
            out[values == MASK_IGNORE] = IGNORE
        else:
            out = rasterise(sample.classes, sample.polygons, image_hw, mapping)
        if out.size and out.max() >= max(channels, 2):
            raise UsageError(f"labels of {sample.path.name} hold class {int(out.max())}; the model has {channels}")
        return out


def rasterise(classes: np.ndarray, polygons: list, image_hw: tuple[int, int], mapping: ClassMapping) -> np.ndarray:
    """Polygons (normalised) filled in order into one class map at ``image_hw``; unlabelled pixels as mapped."""
    import cv2

    h, w = image_hw
    out = np.full((h, w), mapping.unlabelled, np.int32)
    lut = mapping.lut(int(classes.max()) + 1 if len(classes) else 1)
    for cls, poly in zip(np.asarray(classes).ravel(), polygons):
        if len(poly) < 3:
            continue
        points = np.round(np.asarray(poly, np.float64) * [w, h]).astype(np.int32)
        cv2.fillPoly(out, [points], int(lut[int(cls)]))
    return out.astype(np.int64)


def read_mask(path: Path) -> np.ndarray:
    """A mask PNG's class indices (H, W): a palette or greyscale image; one line for anything else."""
    from PIL import Image, UnidentifiedImageError

    try:
        with open_regular(path) as f, Image.open(f) as im:
            if im.mode not in ("P", "L", "I", "I;16"):
                raise UsageError(f"mask {path} is a {im.mode} image: a mask holds one class index per pixel "
                                 "(a greyscale or palette PNG)")
            return np.asarray(im).astype(np.int64)
    except (OSError, UnidentifiedImageError) as exc:
        raise UsageError(f"cannot read mask {path}: {str(exc).splitlines()[0][:160]}") from exc


def mask_path(image: Path) -> Path | None:
    """Where an image's mask lies (``images`` -> ``masks``, ``JPEGImages`` -> ``SegmentationClass``), if it does."""
    parts = image.parts
    for images, masks in MASK_FOLDERS:
        if images in parts[:-1]:
            i = len(parts) - 1 - parts[:-1][::-1].index(images) - 1
            candidate = Path(*parts[:i], masks, *parts[i + 1:-1], image.stem + ".png")
            if candidate.is_file():
                return candidate
    return None


def _image_hw(path: Path) -> tuple[int, int]:
    from PIL import Image, UnidentifiedImageError

    try:
        with open_regular(path) as f, Image.open(f) as im:
            w, h = im.size
            if im.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # turned a quarter, as OpenCV decodes it
                w, h = h, w
            return h, w
    except (OSError, UnidentifiedImageError) as exc:
        raise UsageError(f"cannot read image {path}: {str(exc).splitlines()[0][:160]}") from exc


def read_semantic_split(dataset: Dataset, split: str, model_names: dict[int, str], model_count: int | None, *,
                        model: str, limit: int | None = None) -> SemanticSplit:
    """The labelled images of ``split`` for a semantic model (``limit``: that many, spread evenly)."""
    if dataset.classify_layout:
        raise UsageError(f"{dataset.source} holds class folders (a classify dataset), not class maps for a "
                         "semantic model")
    images = dataset.images(split)
    if limit:
        images = evenly(images, limit)
    names = dict(dataset.names)
    source = dataset.label
    masks = {p: mask_path(p) for p in images}
    notes: list[str] = []
    if any(masks.values()):
        kind = "masks"
        samples = [SemanticSample(p, m, hw=_image_hw(p)) for p, m in masks.items() if m is not None]
        if len(samples) < len(images):
            notes.append(f"{len(images) - len(samples)} image(s) of {source} have no mask and were left out")
    else:
        kind = "polygons"
        samples = _polygon_samples(images, names or dict(model_names), model_count, source, split, notes)
    mapping = class_mapping(names, model_names, model_count, source=source, model=model)
    if mapping is not None:
        notes.extend(mapping.notes)
    elif names:
        notes.append(f"{model} names no class: {source}'s classes are matched by index (its classes 1.. and class 0 "
                     "for unlabelled pixels where its output has one class more)")
    labelled = 0
    for s in samples:
        labelled += _check(s, names, mapping, model_count)
    if not labelled:
        raise UsageError(f"no usable labels in the {split} split of {dataset.source}: no pixel of its "
                         f"{len(samples)} image(s) holds a class of the model (masks: masks/{split}/<stem>.png "
                         f"beside images/{split}; or YOLO polygon labels)")
    if kind == "polygons" and mapping is not None and mapping.unlabelled == IGNORE:
        notes.append(f"{model} has no class for unlabelled pixels (none named background): they are ignored")
    return SemanticSplit(dataset, split, samples, names, mapping, dict(model_names), model_count, kind, labelled,
                         notes)


def _polygon_samples(images, names, model_count, source, split, notes) -> list[SemanticSample]:
    known = names or {i: str(i) for i in range(model_count or MASK_IGNORE)}
    labels = _ultralytics_labels(images, {"names": known, "nc": len(known), "channels": 3}, "segment")
    found = {Path(lb["im_file"]).resolve(): lb for lb in labels}
    samples = []
    for p in images:
        lb = found.get(p.resolve())
        if lb is None:
            continue
        classes = lb["cls"].reshape(-1).astype(np.int64)
        polygons = [np.asarray(s, np.float64).reshape(-1, 2) for s in lb.get("segments") or []]
        if len(classes) and len(polygons) != len(classes):  # boxes only: no polygon to fill
            continue
        samples.append(SemanticSample(p, None, classes, polygons, tuple(int(v) for v in lb["shape"])))
    if len(samples) < len(images):
        notes.append(f"{len(images) - len(samples)} image(s) of {source} could not be read or hold boxes, not "
                     "polygons, and were left out")
    if not any(len(s.classes) for s in samples):
        raise UsageError(f"no usable labels in the {split} split of {source}: neither masks (masks/{split}/<stem>.png "
                         f"beside images/{split}) nor YOLO polygon labels")
    return samples


def _check(sample: SemanticSample, names: dict[int, str], mapping: ClassMapping | None,
           model_count: int | None) -> int:
    """Refuse (one line) a mask at another size or holding a value no class has; the pixels it scores."""
    if sample.mask is None:
        if mapping is None:
            return sample.hw[0] * sample.hw[1]
        return int((rasterise(sample.classes, sample.polygons, sample.hw, mapping) != IGNORE).sum())
    values = read_mask(sample.mask)
    if values.shape != tuple(sample.hw):
        raise UsageError(f"mask {sample.mask} is {values.shape[1]}x{values.shape[0]}, its image {sample.path.name} "
                         f"{sample.hw[1]}x{sample.hw[0]}: a mask is at its image's size")
    present = set(np.unique(values).tolist()) - {MASK_IGNORE}
    allowed = set(names) if names else (set(range(model_count)) if model_count else present)
    strange = sorted(present - allowed)
    if strange:
        raise UsageError(f"mask {sample.mask} holds value {strange[0]}, no class of "
                         f"{'its dataset' if names else 'the model'} (values are class indices; 255 is ignored)")
    if mapping is None:
        return int((values != MASK_IGNORE).sum())
    lut = mapping.lut(int(values.max()) + 1)
    return int(((lut[values] != IGNORE) & (values != MASK_IGNORE)).sum())


# -- classify --------------------------------------------------------------------------------------------
def read_classify_split(dataset: Dataset, split: str, model_names: dict[int, str], model_count: int | None, *,
                        model: str, limit: int | None = None):
    """Ultralytics' folder-per-class layout, folders mapped to the model's classes by name (module docstring)."""
    if not dataset.classify_layout:
        raise UsageError(f"a classify model is scored against a folder of class folders per split (Ultralytics' "
                         f"classify layout), not {dataset.source}")
    pairs = dataset.class_folders(split)
    folders = sorted({p.parent.name for p, _ in pairs})
    notes: list[str] = []
    if model_names:
        by_name: dict[str, int] = {}
        for index in sorted(model_names):
            by_name.setdefault(_norm(model_names[index]), index)
        index = {f: by_name[_norm(f)] for f in folders if _norm(f) in by_name}
        if not index:
            raise UsageError(f"no class folder of {dataset.label} ({', '.join(folders[:6])}) is named as a class of "
                             f"{model} ({_few(model_names)}): classes are matched by name")
        left = [f for f in folders if f not in index]
        if left:
            notes.append(f"{len(left)} class folder(s) of {dataset.label} are no class of {model}; their images "
                         f"were left out: {', '.join(left[:8])}")
        names = dict(model_names)
    else:
        if model_count is not None and len(folders) > model_count:
            raise UsageError(f"{dataset.label} has {len(folders)} class folders; {model} has {model_count} classes")
        index = {f: i for i, f in enumerate(folders)}
        names = {i: f for f, i in index.items()}
        notes.append(f"{model} names no class: the class folders in sorted order are its classes 0, 1, ...")
    samples = [Sample(p, None, index[p.parent.name]) for p, _ in pairs if p.parent.name in index]
    if limit:
        samples = evenly(samples, limit)
    return LabelledSplit(dataset, split, "classify", samples, names, notes=notes)
