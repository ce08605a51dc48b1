"""Labels of an Ultralytics dataset, as its validators read them, letterboxed as enginekit's runtime letterboxes.

``verify --data`` scores each graph's predictions against a dataset's labels. The labels are read by
Ultralytics itself (``YOLODataset``: its label parsing and checks; its label cache goes to a temporary
folder, never beside the user's labels) and moved into the network input's pixels by Ultralytics' own
``LetterBox`` and ``Format`` transforms, with the letterbox the runtime gives that frame (the frame's
rectangle where the graph or engine takes it, else the full size); then as each validator's
``_prepare_batch`` does: boxes to pixels (xyxy; obb xywhr), keypoints to pixels, overlapping masks (at 1/4
of the input, ``mask_ratio`` 4) to one mask per instance. Classify: Ultralytics' folder-per-class layout.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginekit.compare.instances import Instances
from enginekit.datasets import Dataset, evenly
from enginekit.errors import UsageError
from enginekit.fsutil import refuse_special_file
from enginekit.hashing import sha256_file

#: part of every ground-truth key: bump when the reading or the letterboxing of labels changes
LABELS_VERSION = 1


@dataclass
class Sample:
    """One labelled image: its file and what the validator compares against (filled per letterbox)."""

    path: Path
    label: dict | None = None  # Ultralytics' label dict (instance tasks); None: classify
    class_id: int = -1  # classify


@dataclass
class LabelledSplit:
    """A dataset split's images and labels for one family's task."""

    dataset: Dataset
    split: str
    task: str
    samples: list[Sample]
    names: dict[int, str]
    options: dict = field(default_factory=dict)  # kpt_shape...
    notes: list[str] = field(default_factory=list)

    def digest(self) -> str:
        """The identity of what is scored: every image and label file's content, the task, the class names."""
        h = hashlib.sha256(f"labels/{LABELS_VERSION}|{self.task}|{sorted(self.names.items())}".encode())
        for s in self.samples:
            h.update(sha256_file(s.path).encode())
            if s.label is not None:
                h.update(repr((s.label["cls"].ravel().tolist(), np.round(s.label["bboxes"], 6).ravel().tolist(),
                               [np.round(x, 6).ravel().tolist() for x in s.label.get("segments", [])],
                               None if s.label.get("keypoints") is None else
                               np.round(s.label["keypoints"], 6).ravel().tolist())).encode())
            else:
                h.update(f"|{s.class_id}".encode())
        return h.hexdigest()

    @property
    def instances(self) -> int:
        return sum(len(s.label["cls"]) if s.label is not None else 1 for s in self.samples)

    @property
    def max_labels(self) -> int:
        return max((len(s.label["cls"]) for s in self.samples if s.label is not None), default=0)


def read_split(dataset: Dataset, split: str, task: str, model_names: dict[int, str], *,
               limit: int | None = None, kpt_shape=None, imgsz: int = 640) -> LabelledSplit:
    """The labelled images of ``split`` (``limit``: that many, spread evenly over the sorted list). ``imgsz``: the
    network's longer side, the size Ultralytics' validator loads each image at (``val_image``)."""
    if task == "classify":
        return _classify_split(dataset, split, model_names, limit)
    if dataset.classify_layout:
        raise UsageError(f"{dataset.source} holds class folders (a classify dataset), not YOLO labels for a {task} model")
    images = dataset.images(split)
    if limit:
        images = evenly(images, limit)
    names = dataset.names or dict(model_names)
    notes = []
    if dataset.names and model_names and len(dataset.names) != len(model_names):
        raise UsageError(f"{dataset.source} has {len(dataset.names)} classes; the model has {len(model_names)}")
    if dataset.names and model_names and [dataset.names.get(i) for i in sorted(model_names)] != \
            [model_names[i] for i in sorted(model_names)]:
        notes.append(f"the class names of {dataset.label} differ from the model's: classes are matched by index")
    data = {"names": names, "nc": len(names), "channels": 3, **dataset.options}
    if task == "pose":
        data["kpt_shape"] = list(kpt_shape or dataset.options.get("kpt_shape") or [17, 3])
    labels = _ultralytics_labels(images, data, task, imgsz)
    found = {Path(lb["im_file"]).resolve(): lb for lb in labels}
    samples = [Sample(p, found[p.resolve()]) for p in images if p.resolve() in found]
    missing = len(images) - len(samples)
    if not samples:
        raise UsageError(f"no readable labelled images in the {split} split of {dataset.source}")
    if missing:
        notes.append(f"{missing} image(s) of {dataset.label} could not be read and were left out")
    classes = np.concatenate([s.label["cls"].ravel() for s in samples]) if samples else np.zeros(0)
    if len(classes) and (classes.max() >= len(names) or classes.min() < 0):
        raise UsageError(f"labels of {dataset.source} name class {int(classes.max())}; the model has {len(names)} classes")
    return LabelledSplit(dataset, split, task, samples, names, {"kpt_shape": data.get("kpt_shape")}, notes)


def _ultralytics_labels(images: list[Path], data: dict, task: str, imgsz: int = 640) -> list[dict]:
    """Ultralytics' label dicts of ``images`` (its parsing and checks), its label cache in a temporary folder. Each
    keeps its dataset (``_dataset``, made at ``imgsz``) and its place in it (``_index``): ``val_image`` loads it."""
    from ultralytics.data.dataset import YOLODataset
    from ultralytics.data.utils import img2label_paths

    for image, label in zip(images, img2label_paths([str(p) for p in images])):  # Ultralytics' threads would block
        refuse_special_file(image, "image")
        refuse_special_file(label, "label file")

    class Labels(YOLODataset):
        def get_img_files(self, img_path):  # the images chosen (a list of files, not of file lists)
            return [str(p) for p in img_path]

        def _load_or_scan_cache(self, cache_path, cache_hash):  # never beside the user's labels
            return super()._load_or_scan_cache(Path(self._scratch) / "labels.cache", cache_hash)

    with tempfile.TemporaryDirectory(prefix="enginekit-labels-") as scratch:
        Labels._scratch = scratch
        try:
            ds = Labels(img_path=[str(p) for p in images], imgsz=imgsz, augment=False, rect=False, data=data, task=task,
                        prefix="", batch_size=1)
        except (RuntimeError, FileNotFoundError, ValueError, AssertionError) as exc:
            raise UsageError(f"cannot read the labels of {images[0].parent}: {str(exc).splitlines()[0][:200]}") from exc
        labels = list(ds.labels)
        for i, lb in enumerate(labels):
            lb["_dataset"] = ds  # its update_labels_info (segments resampled, Instances) per task; load_image
            lb["_index"] = i
    return labels


def _classify_split(dataset: Dataset, split: str, model_names: dict[int, str], limit: int | None) -> LabelledSplit:
    if not dataset.classify_layout:
        raise UsageError(f"a classify model is scored against a folder of class folders per split (Ultralytics' "
                         f"classify layout), not {dataset.source}")
    pairs = dataset.class_folders(split)
    folders = sorted({p.parent.name for p, _ in pairs})
    by_name = {v: k for k, v in model_names.items()}
    if model_names and all(f in by_name for f in folders):  # folders named as the model's classes
        index = {f: by_name[f] for f in folders}
    elif model_names and len(folders) != len(model_names):
        raise UsageError(f"{dataset.source} has {len(folders)} class folders; the model has {len(model_names)} classes")
    else:  # Ultralytics' ImageFolder order: sorted folder names
        index = {f: i for i, f in enumerate(folders)}
    samples = [Sample(p, None, index[p.parent.name]) for p, _ in pairs]
    if limit:
        samples = evenly(samples, limit)
    return LabelledSplit(dataset, split, "classify", samples, dict(model_names) or {i: f for f, i in index.items()})


# -- labels in the network input's pixels ----------------------------------------------------------------
# -- Ultralytics' validator's input (``yolo val``): the image at the network's longer side, padded into its
# rectangle (rect=True, batch 1: the .pt and graphs of any H x W) or the full size (files of one size) ----------
VAL_PAD = 0.5  # the validator's rectangle padding, in strides (``build_yolo_dataset``: pad 0.5 in val mode)


def val_rectangles(shapes: list[tuple[int, int]], imgsz: int, stride: int) -> list[tuple[int, int]]:
    """Per image (H x W as read), the input H x W Ultralytics' validator gives it at batch 1 with ``rect=True``
    (``YOLO(pt).val()``'s default): its dataset's own ``set_rectangle``, run over the shapes alone (each side to
    ``imgsz`` by the aspect ratio, in strides, plus half a stride, rounded up: a 4:3 photograph at 640 gets
    512x672, a square one 672x672)."""
    from types import SimpleNamespace

    from ultralytics.data.base import BaseDataset

    if not shapes:
        return []
    rect = SimpleNamespace(ni=len(shapes), batch_size=1, labels=[{"shape": tuple(s)} for s in shapes],
                           im_files=list(range(len(shapes))), imgsz=imgsz, stride=stride, pad=VAL_PAD)
    BaseDataset.set_rectangle(rect)  # sorts by aspect ratio: im_files says where each went
    out: list = [None] * len(shapes)
    for place, original in enumerate(rect.im_files):
        out[original] = tuple(int(v) for v in rect.batch_shapes[rect.batch[place]])
    return out


def val_image(sample: Sample) -> np.ndarray:
    """``sample``'s image as Ultralytics' validator loads it (BGR): its longer side to the network's
    (``BaseDataset.load_image``: OpenCV, INTER_LINEAR), before the letterbox pads it."""
    return sample.label["_dataset"].load_image(sample.label["_index"])[0]


def val_letterbox(hw: tuple[int, int]):
    """The validator's ``LetterBox``: into ``hw`` centred, grey 114, never enlarging (``scaleup=False``)."""
    from ultralytics.data.augment import LetterBox

    return LetterBox(new_shape=tuple(int(v) for v in hw), scaleup=False)


def truth_instances(split: LabelledSplit, sample: Sample, image_bgr: np.ndarray, letterbox) -> Instances:
    """``sample``'s labels as the validator compares them: in the pixels of the input ``letterbox`` (Ultralytics'
    ``LetterBox``, the runtime's for this frame) makes of ``image_bgr``."""
    import copy

    import torch
    from ultralytics.data.augment import Format
    from ultralytics.utils import ops

    label = {k: v for k, v in sample.label.items() if k != "_dataset"}
    label = copy.deepcopy(label)
    label.pop("shape", None)
    label["img"] = image_bgr
    label["ori_shape"] = label["resized_shape"] = image_bgr.shape[:2]
    label["ratio_pad"] = (1.0, 1.0)
    label = sample.label["_dataset"].update_labels_info(label)
    label = letterbox(label)
    task = split.task
    label = Format(bbox_format="xywh", normalize=True, return_mask=task == "segment", return_keypoint=task == "pose",
                   return_obb=task == "obb", batch_idx=True, mask_ratio=4, mask_overlap=True, bgr=0.0)(label)
    h, w = label["img"].shape[1:]
    cls = label["cls"].reshape(-1).long()
    n = len(cls)
    boxes = label["bboxes"].reshape(n, 5 if task == "obb" else 4).float()  # n may be 0: an image of nothing
    if task == "obb":
        boxes[:, :4] *= torch.tensor([w, h, w, h])
    elif n:
        boxes = ops.xywh2xyxy(boxes) * torch.tensor([w, h, w, h])
    masks = keypoints = None
    if task == "segment":
        overlap = label["masks"]  # (1, h/4, w/4): instance i + 1 where it lies on top
        index = torch.arange(1, n + 1).view(n, 1, 1)
        masks = (overlap == index).float() if n else torch.zeros((0, h // 4, w // 4))
        if n and tuple(masks.shape[1:]) != (h // 4, w // 4):
            masks = torch.nn.functional.interpolate(masks[None], (h // 4, w // 4), mode="bilinear",
                                                    align_corners=False)[0].gt_(0.5)
        masks = masks.numpy()
    if task == "pose":
        k = label["keypoints"].clone().float()
        k[..., 0] *= w
        k[..., 1] *= h
        keypoints = k.numpy()
    return Instances(np.ascontiguousarray(boxes.numpy(), dtype=np.float32), np.ones(n, np.float32),
                     cls.numpy().astype(np.int64), masks=masks, keypoints=keypoints)
