"""One results contract for every backend and task, per image, in the original image's pixels.

Detections (boxes), Segments (boxes + masks), Poses (boxes + keypoints), OrientedBoxes (rotated
boxes), Classification (top-k classes), SemanticMap (a class per pixel) and DepthMap. ``to_json()`` is what ``enginekit predict``
writes; ``plot(frame)`` draws a YOLO result with Ultralytics' own ``Results.plot``.
"""

from __future__ import annotations

from typing import Any

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Timings:
    """Milliseconds spent per stage on one image: its share of the batch it ran in (the batch's time over its
    ``batch`` images, as Ultralytics reports time per image), so two photographs predicted together show their own."""

    preprocess: float = 0.0
    infer: float = 0.0
    postprocess: float = 0.0
    batch: int = 1  # how many images shared the inference call

    def share(self, pre_ms: float, infer_ms: float, post_ms: float, batch: int) -> None:
        """This image's share of a batch of ``batch`` images that took these times."""
        n = max(int(batch), 1)
        self.preprocess, self.infer, self.postprocess, self.batch = pre_ms / n, infer_ms / n, post_ms / n, n

    @property
    def total(self) -> float:
        return self.preprocess + self.infer + self.postprocess

    def to_json(self) -> dict[str, float]:
        return {"preprocess_ms": round(self.preprocess, 3), "infer_ms": round(self.infer, 3),
                "postprocess_ms": round(self.postprocess, 3), "total_ms": round(self.total, 3), "batch": self.batch}


def counted_names(names, class_ids=None) -> str:
    """``4 persons, 1 bus``: each name with its count, in the order of the class indices (``class_ids``, beside
    ``names``), as Ultralytics' ``Results.verbose`` lists them; ``(no detections)`` for none."""
    from collections import Counter

    names = [str(n) for n in names]
    ids = [int(i) for i in class_ids] if class_ids is not None and len(class_ids) == len(names) else None
    counts = Counter(zip(ids, names) if ids is not None else ((0, n) for n in names))
    if not counts:
        return "(no detections)"

    def label(name: str, n: int) -> str:
        if name.isdigit():  # a model with no class names (random weights): its indices
            return f"#{name}"
        return name + ("s" if n > 1 and name[-1:].isalpha() and not name.endswith("s") else "")

    order = sorted(counts) if ids is not None else [key for key, _ in counts.most_common()]
    return ", ".join(f"{counts[key]} {label(key[1], counts[key])}" for key in order)


@dataclass
class Detections:
    """Boxes (N x 4, xyxy in the original image's pixels), scores, class ids and their names."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    names: list[str]
    image_shape: tuple[int, int]  # original H, W
    source: str | None = None
    timings: Timings = field(default_factory=Timings)
    kind = "detections"

    def __len__(self) -> int:
        return len(self.scores)

    def found(self) -> str:
        """What it found, as Ultralytics' predictor says it: ``4 persons, 1 bus`` (most first)."""
        return counted_names(self.names, self.class_ids)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "source": self.source,
            "image_shape": list(self.image_shape),
            "detections": [
                {"box": [round(float(v), 2) for v in b], "score": round(float(s), 5), "class_id": int(c), "name": n}
                for b, s, c, n in zip(self.boxes, self.scores, self.class_ids, self.names)
            ],
            "timings": self.timings.to_json(),
        }

    def _label_names(self) -> dict[int, str]:
        return {int(c): n for c, n in zip(self.class_ids, self.names)}

    def to_ultralytics(self, frame: np.ndarray):
        """This result as Ultralytics' ``Results`` over ``frame`` (BGR, the image it was computed on)."""
        import torch
        from ultralytics.engine.results import Results

        boxes = np.concatenate([self.boxes, self.scores[:, None], self.class_ids[:, None]], 1).astype(np.float32)
        return Results(frame, path=self.source or "", names=self._label_names(), boxes=torch.from_numpy(boxes))

    def plot(self, frame: np.ndarray) -> np.ndarray:
        """An overlay (BGR): Ultralytics' ``Results.plot`` of this result on ``frame``."""
        return self.to_ultralytics(frame).plot()


@dataclass
class Segments(Detections):
    """Detections with one instance mask each: ``masks`` N x H x W bool at the original resolution."""

    masks: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), bool))
    kind = "segments"

    def polygons(self) -> list[np.ndarray]:
        """Each mask's outline (K x 2 pixels; a mask in several parts is merged into one), as Ultralytics'
        ``Masks.xy`` gives it."""
        from ultralytics.utils import ops

        if not len(self.masks):
            return []
        return ops.masks2segments(self.masks.astype(np.uint8))

    def to_json(self) -> dict:
        out = super().to_json()
        for d, mask, poly in zip(out["detections"], self.masks, self.polygons()):
            d["mask"] = {"area": int(mask.sum()), "polygon": [[round(float(x), 1), round(float(y), 1)] for x, y in poly]}
        return out

    def to_ultralytics(self, frame: np.ndarray):
        import torch

        result = super().to_ultralytics(frame)
        if len(self.masks):
            result.update(masks=torch.from_numpy(self.masks.astype(np.uint8)))
        return result


@dataclass
class Poses(Detections):
    """Detections with keypoints: ``keypoints`` N x K x 3 (x, y in original pixels, visibility) or N x K x 2."""

    keypoints: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 3), np.float32))
    kind = "poses"

    def to_json(self) -> dict:
        out = super().to_json()
        for d, k in zip(out["detections"], self.keypoints):
            d["keypoints"] = [[round(float(v), 2 if i < 2 else 4) for i, v in enumerate(p)] for p in k]
        return out

    def to_ultralytics(self, frame: np.ndarray):
        import torch

        result = super().to_ultralytics(frame)
        if len(self.keypoints):
            result.update(keypoints=torch.from_numpy(self.keypoints.astype(np.float32)))
        return result


@dataclass
class OrientedBoxes:
    """Rotated boxes: ``boxes`` N x 5 (centre x, y, width, height in original pixels, angle in radians, as
    Ultralytics' ``OBB.xywhr``), scores, class ids and their names; ``corners`` N x 4 x 2."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    names: list[str]
    image_shape: tuple[int, int]
    source: str | None = None
    timings: Timings = field(default_factory=Timings)
    kind = "oriented_boxes"

    def __len__(self) -> int:
        return len(self.scores)

    def found(self) -> str:
        return counted_names(self.names, self.class_ids)

    @property
    def corners(self) -> np.ndarray:
        from ultralytics.utils import ops

        if not len(self.boxes):
            return np.zeros((0, 4, 2), np.float32)
        return np.asarray(ops.xywhr2xyxyxyxy(self.boxes.astype(np.float32)), np.float32)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "source": self.source,
            "image_shape": list(self.image_shape),
            "detections": [
                {"xywhr": [round(float(v), 2) for v in b[:4]] + [round(float(b[4]), 5)],
                 "corners": [[round(float(x), 2), round(float(y), 2)] for x, y in c],
                 "score": round(float(s), 5), "class_id": int(i), "name": n}
                for b, c, s, i, n in zip(self.boxes, self.corners, self.scores, self.class_ids, self.names)
            ],
            "timings": self.timings.to_json(),
        }

    def to_ultralytics(self, frame: np.ndarray):
        import torch
        from ultralytics.engine.results import Results

        data = np.concatenate([self.boxes, self.scores[:, None], self.class_ids[:, None]], 1).astype(np.float32)
        names = {int(c): n for c, n in zip(self.class_ids, self.names)}
        return Results(frame, path=self.source or "", names=names, obb=torch.from_numpy(data.reshape(-1, 7)))

    def plot(self, frame: np.ndarray) -> np.ndarray:
        return self.to_ultralytics(frame).plot()


@dataclass
class Classification:
    """The top-k classes of an image: ``class_ids`` and their ``scores`` (probabilities), best first, with
    ``names``; ``probabilities`` holds every class's."""

    class_ids: np.ndarray
    scores: np.ndarray
    names: list[str]
    probabilities: np.ndarray
    image_shape: tuple[int, int]
    source: str | None = None
    timings: Timings = field(default_factory=Timings)
    kind = "classification"

    @property
    def top1(self) -> int:
        return int(self.class_ids[0])

    def found(self) -> str:
        """The top classes with their probabilities: ``tabby 0.93, tiger cat 0.05``."""
        return ", ".join(f"{n} {float(s):.2f}" for n, s in list(zip(self.names, self.scores))[:5])

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "source": self.source,
            "image_shape": list(self.image_shape),
            "top": [{"class_id": int(c), "name": n, "score": round(float(s), 5)}
                    for c, s, n in zip(self.class_ids, self.scores, self.names)],
            "timings": self.timings.to_json(),
        }

    def to_ultralytics(self, frame: np.ndarray):
        import torch
        from ultralytics.engine.results import Results

        names = {i: str(i) for i in range(len(self.probabilities))}
        names.update({int(c): n for c, n in zip(self.class_ids, self.names)})
        return Results(frame, path=self.source or "", names=names,
                       probs=torch.from_numpy(self.probabilities.astype(np.float32)))

    def plot(self, frame: np.ndarray) -> np.ndarray:
        """The top five classes written on ``frame`` by Ultralytics' ``Results.plot``."""
        return self.to_ultralytics(frame).plot()


@dataclass
class DepthMap:
    """Relative depth (inverse depth, larger is nearer), H x W float32 at the original resolution.

    ``depth`` is a NumPy array; a map computed on a GPU stays there until it is read as one (``depth``: one copy, then
    kept), and ``tensor`` gives it where it was computed (a torch tensor on the GPU: no copy)."""

    data: Any  # np.ndarray, or a torch tensor on the device that computed it
    image_shape: tuple[int, int]
    source: str | None = None
    timings: Timings = field(default_factory=Timings)
    kind = "depth"

    @property
    def depth(self) -> np.ndarray:
        if not isinstance(self.data, np.ndarray):
            self.data = self.data.float().cpu().numpy().astype(np.float32, copy=False)
        return self.data

    @property
    def tensor(self):
        """The map as a torch tensor where it was computed (on the GPU for a session there)."""
        import torch

        return self.data if not isinstance(self.data, np.ndarray) else torch.from_numpy(self.data)

    def found(self) -> str:
        d = self.depth[np.isfinite(self.depth)]
        return f"relative depth {float(d.min()):.3g} to {float(d.max()):.3g}" if d.size else "no finite depth"

    def to_json(self) -> dict:
        d = self.depth
        finite = bool(np.isfinite(d).all())
        return {
            "kind": self.kind,
            "source": self.source,
            "image_shape": list(self.image_shape),
            "depth": {"min": float(np.nanmin(d)), "max": float(np.nanmax(d)), "mean": float(np.nanmean(d)),
                      "finite": finite},
            "timings": self.timings.to_json(),
        }


@dataclass
class SemanticMap:
    """A class id per pixel (H x W at the original resolution) and the names of the classes."""

    class_map: np.ndarray
    class_names: dict[int, str]
    image_shape: tuple[int, int]
    source: str | None = None
    timings: Timings = field(default_factory=Timings)
    kind = "semantic"

    def found(self) -> str:
        """The classes covering most of the image: ``road 52%, sky 30%, car 13%``."""
        ids, counts = np.unique(self.class_map, return_counts=True)
        order = np.argsort(-counts)[:4]
        total = float(self.class_map.size) or 1.0
        return ", ".join(f"{self.class_names.get(int(ids[i]), str(int(ids[i])))} {100 * counts[i] / total:.0f}%"
                         for i in order) + (f" (+{len(ids) - 4} more)" if len(ids) > 4 else "")

    def to_json(self) -> dict:
        ids, counts = np.unique(self.class_map, return_counts=True)
        total = float(self.class_map.size) or 1.0
        return {
            "kind": self.kind,
            "source": self.source,
            "image_shape": list(self.image_shape),
            "classes": [{"class_id": int(i), "name": self.class_names.get(int(i), str(int(i))),
                         "pixels": int(c), "share": round(float(c) / total, 6)} for i, c in zip(ids, counts)],
            "timings": self.timings.to_json(),
        }

    def plot(self, frame: np.ndarray) -> np.ndarray:
        """The class map in Ultralytics' colour palette, blended over the frame."""
        from ultralytics.utils.plotting import colors

        palette = np.array([colors(i, bgr=True) for i in range(int(self.class_map.max()) + 1)], np.uint8)
        return (0.5 * frame + 0.5 * palette[self.class_map]).astype(np.uint8)
