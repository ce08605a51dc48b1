"""One results contract for every backend: detections or a depth map, per image, in original pixels."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Timings:
    """Milliseconds spent per stage on one batch (shared by its images)."""

    preprocess: float = 0.0
    infer: float = 0.0
    postprocess: float = 0.0

    @property
    def total(self) -> float:
        return self.preprocess + self.infer + self.postprocess

    def to_json(self) -> dict[str, float]:
        return {"preprocess_ms": round(self.preprocess, 3), "infer_ms": round(self.infer, 3),
                "postprocess_ms": round(self.postprocess, 3), "total_ms": round(self.total, 3)}


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


@dataclass
class DepthMap:
    """Relative depth (inverse depth, larger is nearer), H x W float32 at the original resolution."""

    depth: np.ndarray
    image_shape: tuple[int, int]
    source: str | None = None
    timings: Timings = field(default_factory=Timings)
    kind = "depth"

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
