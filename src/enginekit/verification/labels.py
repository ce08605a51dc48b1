"""``verify --data``: the FP32 PyTorch model and every candidate scored against a dataset's labels.

Each image is loaded and letterboxed as the family's own validator does it, so the FP32 figure is the one users
already have: YOLO's (detect, segment, pose, obb) as ``yolo val`` at its defaults, the image's longer side at the
network's and padded into its validator rectangle (``rect=True`` at batch 1: stride-aligned plus half a stride) for
the PyTorch model and every graph that takes any H x W, as ``YOLO(pt).val()``; into the network's size for a file of
one size, as ``YOLO(file).val()`` (``families.ultralytics.labels``). Other families: the runtime's preprocessing
(the image's own rectangle where the graph takes it, else the network's size). One image per inference (batch 1);
the outputs are decoded by the family as Ultralytics' validator decodes them (confidence 0.001, obb 0.01, NMS IoU 0.7,
multi-label, 300 per image or the most labels an image has) and scored by Ultralytics' validator metrics
(``compare.ground_truth``). The FP32 PyTorch reference is scored with each candidate's own letterbox, so a
candidate's drop is its own loss. Semantic models (``families.torch_models``): every frame goes to the
network's size as the runtime takes it, and the class map the runtime gives at the frame's size is scored
against the labelled class map (``SemanticScores``). Every score is a cache entry (``ground-truth``) keyed
by the candidate (weights, graph sha256 or engine key), the labels' content (masks and polygons too) and the
input sizes: a second verify scores nothing again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from enginekit import reporting
from enginekit.compare.intervals import decide, images_to_decide, paired_drop
from enginekit.compare.label_metrics import HEADLINE, drops
from enginekit.compare.instances import IOU_NMS, MAX_DET
from enginekit.errors import UsageError
from enginekit.compare.metrics import passes
from enginekit.datasets import load_dataset
from enginekit.pipeline import model_versions
from enginekit.verification.gate import Check

GROUND_TRUTH_VERSION = 3


@dataclass(frozen=True)
class LabelRequest:
    """Which labels: a dataset YAML or folder, its split, and how many images (spread evenly; None: all)."""

    source: Path
    split: str = "val"
    limit: int | None = None

    def check(self) -> None:
        """Refuse (one line) a dataset that cannot be read or whose split has no images."""
        dataset = load_dataset(self.source)
        if dataset.classify_layout:
            dataset.class_folders(self.split)
        else:
            dataset.images(self.split)


class GroundTruth:
    """A labelled split for one model, scored per candidate (cached)."""

    def __init__(self, pipe, request: LabelRequest, metadata: dict[str, str], hw: tuple[int, int]):
        self.pipe, self.adapter, self.request = pipe, pipe.adapter, request
        self.metadata = dict(metadata)
        self.hw = tuple(hw)
        if not hasattr(self.adapter, "read_labels") or not hasattr(self.adapter, "label_scores"):
            raise UsageError(f"{self.adapter.variant} ({self.adapter.family}) takes no labels: verify --data scores "
                             "detect, segment, pose, obb, classify and semantic models")
        self.unit = "labelled pixels" if self.adapter.task == "semantic" else "instances"  # what ``instances`` counts
        with reporting.stage(f"labels ({request.source.name}, {request.split})") as s:
            self.split = self.adapter.read_labels(load_dataset(request.source), request.split, self.metadata,
                                                  limit=request.limit, imgsz=max(self.hw))
            s.detail = f"{len(self.split.samples)} images, {self.split.instances} {self.unit}"
        if not self.split.instances:  # every figure would be 0 for the reference and each graph alike: no check
            raise UsageError(f"--data {request.source}: its {request.split} split holds no labels for a "
                             f"{self.adapter.task} model ({len(self.split.samples)} images, 0 {self.unit}): "
                             "nothing to score against")
        self.digest = self.split.digest()
        self.max_det = max(MAX_DET, self.split.max_labels)  # as the validator raises its max_det to fit the labels
        self.notes = list(self.split.notes)
        self.task = self.split.task
        self.headline = HEADLINE.get(self.task, "map50_95")

    def describe(self) -> dict:
        return {"data": str(self.request.source), "split": self.request.split, "images": len(self.split.samples),
                "instances": self.split.instances, "network_hw": list(self.hw), "headline": self.headline,
                "limit": self.request.limit, "unit": self.unit}

    # -- input sizes -------------------------------------------------------------------------------
    def input_sizes(self, accepts_hw: Callable | None) -> list[tuple[tuple[int, int], bool]]:
        """Per image: (network input H x W, whether it is the image's rectangle). A family scored as its own
        validator scores (``label_rectangles``, YOLO's ``yolo val``) gives its rectangles; else the image's
        rectangle as the candidate's runtime makes it (``rect_hw``). A candidate that does not take a rectangle
        (a graph or engine of one size) gets the network's size, as ``YOLO(file).val()`` does."""
        if hasattr(self.adapter, "label_rectangles"):
            rects = self.adapter.label_rectangles(self.split, self.hw)
        else:
            rects = [self.adapter.rect_hw(s, self.hw) if s is not None else None
                     for s in (_image_hw(sample) for sample in self.split.samples)]
        sizes = []
        for rect in rects:
            if rect is not None and tuple(rect) != self.hw and accepts_hw is not None and accepts_hw(tuple(rect)):
                sizes.append((tuple(rect), True))
            else:
                sizes.append((self.hw, False))
        return sizes

    def letterbox_of(self, sizes) -> str:
        """The letterbox a score was made at, in words (the report's column)."""
        rects = sum(1 for _, r in sizes if r)
        full = "x".join(map(str, self.hw))
        if not hasattr(self.adapter, "label_rectangles"):
            return full if not rects else f"own rectangle ({rects} of {len(sizes)})" if rects < len(sizes) else \
                "own rectangle"
        if rects == len(sizes):
            return "val rect"
        return full if not rects else f"val rect {rects} of {len(sizes)}, else {full}"

    # -- scoring ------------------------------------------------------------------------------------
    def score(self, name: str, identity: str, run: Callable, accepts_hw: Callable | None, versions: dict) -> dict:
        """The candidate ``run`` (feed -> outputs) scored against the labels: cached by ``identity``."""
        sizes = self.input_sizes(accepts_hw)
        parts = {"stage": "ground-truth", "version": GROUND_TRUTH_VERSION, "candidate": identity,
                 "labels": self.digest, "network_hw": list(self.hw),
                 "inputs": hashlib.sha256(json.dumps([list(hw) for hw, _ in sizes]).encode()).hexdigest(),
                 "decode": {"conf": getattr(self.adapter, "label_conf", 0.001), "iou": IOU_NMS, "max_det": self.max_det,
                            "multi_label": True},
                 "versions": versions}

        def produce(tmp: Path) -> dict:
            return {"result": self._score(run, sizes), "rectangles": sum(r for _, r in sizes)}

        with reporting.stage(f"labels: {name}") as s:
            entry, status = self.pipe.cache.get_or_create("ground-truth", parts, produce, subject=self.pipe.subject)
            s.status = status
        result = dict(entry.manifest["result"])
        result["rectangles"] = float(entry.manifest.get("rectangles", 0))
        result["letterbox"] = self.letterbox_of(sizes)
        return result

    def _score(self, run: Callable, sizes) -> dict:
        import cv2

        scores = self.adapter.label_scores(self.split.names, self.metadata)
        name = self.adapter.input_name
        for sample, (hw, rect) in zip(self.split.samples, sizes):
            if hasattr(self.adapter, "label_input"):  # as the family's validator loads and letterboxes it
                bgr, x, letterbox = self.adapter.label_input(sample, hw)
            else:
                bgr = cv2.imread(str(sample.path), cv2.IMREAD_COLOR)
                if bgr is None:
                    raise UsageError(f"cannot read image {sample.path}")
                rgb = np.ascontiguousarray(bgr[..., ::-1])
                x = self.adapter.preprocess_rect(rgb, self.hw) if rect else self.adapter.preprocess(rgb, self.hw)
                letterbox = self.adapter.label_letterbox(bgr.shape[:2], self.hw, rect) if hasattr(
                    self.adapter, "label_letterbox") else None
            if tuple(x.shape[2:]) != tuple(hw):
                raise ValueError(f"{sample.path.name} letterboxed to {x.shape[2:]}, not {hw}")
            outputs = run({name: np.ascontiguousarray(x, dtype=np.float32)})
            self.adapter.add_label_image(scores, self.split, sample, bgr, outputs, self.metadata, letterbox, self.max_det)
        return scores.result()

    def reference(self, accepts_hw: Callable | None) -> dict:
        """The FP32 PyTorch model, letterboxed as a candidate that takes ``accepts_hw``'s sizes."""
        pipe = self.pipe
        identity = f"pytorch:{pipe.request.weights_identity}" + (
            f"+nms:{json.dumps(self.adapter.nms.to_json(), sort_keys=True)}" if self.adapter.nms is not None else "")

        def run(feed):
            return self.adapter.reference(pipe.loaded, feed[self.adapter.input_name])

        return self.score("PyTorch FP32", identity, run, accepts_hw, model_versions(self.adapter))

    def judge(self, art, reference: dict, candidate: dict, gates, precision: str) -> None:
        """The candidate's figures, its drop against the reference with its 95% interval (a paired bootstrap over the
        images: ``compare.intervals``), and the gates on the drop, into ``art``: a gate passes where the whole
        interval is within its limit, fails where none of it is, and is otherwise "not enough evidence" (failed)."""
        reference, candidate = dict(reference), dict(candidate)
        ref_boot, cand_boot = reference.pop("replicates", {}) or {}, candidate.pop("replicates", {}) or {}
        lost = drops(reference, candidate)
        art.ground_truth = {**candidate, **lost, "reference": {k: v for k, v in reference.items()}}
        limits = gates.ground_truth(precision)
        intervals = {}
        images = int(candidate.get("images", 0))
        for metric, limit in limits.items():
            if metric not in lost:
                continue
            value, figure = lost[metric], metric[: -len("_drop")]
            name = f"labels {figure} drop"
            if figure not in ref_boot or figure not in cand_boot:  # a figure with no replicates: its point value
                art.checks.append(Check(art.name, name, value, "<=", limit, passes("<=", value, limit)))
                continue
            interval = paired_drop(ref_boot[figure], cand_boot[figure])
            intervals[metric] = interval.to_json()
            verdict = decide(interval, "<=", limit)
            if verdict == "undecided":
                need = images_to_decide(interval, value, limit, images)
                name = (f"{name}: not enough evidence: the drop is between {interval.low:.4f} and {interval.high:.4f} "
                        f"on {images} image(s); about {need} images would decide")
            art.checks.append(Check(art.name, name, value, "<=", limit, verdict == "pass", key=f"labels {figure} drop",
                                    interval=interval.to_json()))
        art.ground_truth["limits"] = {k: v for k, v in limits.items() if k in lost}
        art.ground_truth["intervals"] = intervals


def _image_hw(sample) -> tuple[int, int] | None:
    """An image's H x W as Ultralytics read it (EXIF orientation applied), without decoding it again."""
    if sample.label is not None and sample.label.get("shape") is not None:
        h, w = sample.label["shape"]
        return int(h), int(w)
    return None
