"""Run what enginekit built: ``load(target)`` -> a predictor over TensorRT, ONNX Runtime or PyTorch.

    predictor = load("model.onnx")           # or an engine plan, a cache key; backend="auto"
    result = predictor("bus.jpg")            # Detections: boxes (xyxy, original pixels), scores, class_ids, names
    seg = load("yolo11n-seg", weights="seg.pt", backend="torch")("bus.jpg")   # Segments: + masks N x H x W
    # Poses (+ keypoints N x K x 3), OrientedBoxes (xywhr), Classification (top-5 class_ids, scores, names)
    depth = load("depth", random_init=True, backend="torch")(frame_bgr)   # DepthMap: depth H x W float32

This ``load`` only loads what exists; ``enginekit.load`` also exports or builds what a model name
needs first. The backends are ``enginekit.backends``'; importing this package is cheap: backends
load their libraries when a predictor is made.
"""

from __future__ import annotations

from enginekit import results
from enginekit.backends.providers import onnxruntime_providers
from enginekit.runtime import predictor
from enginekit.runtime.loader import load

RESULTS = ("Detections", "Segments", "Poses", "OrientedBoxes", "Classification", "SemanticMap", "DepthMap")
__all__ = ["load", "Predictor", "Pipeline", *RESULTS, "onnxruntime_providers"]


def __getattr__(name: str):
    if name == "load":
        return load
    if name in ("Predictor", "Pipeline"):
        return getattr(predictor, name)
    if name in RESULTS:  # defined with the processors' common ground, enginekit.results

        return getattr(results, name)
    if name == "onnxruntime_providers":
        return onnxruntime_providers
    raise AttributeError(name)
