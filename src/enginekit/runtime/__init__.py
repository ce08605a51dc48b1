"""Run what enginekit built: ``load(target)`` -> a predictor over TensorRT, ONNX Runtime or PyTorch.

    predictor = load("yolo12n", precision="fp16", weights="best.pt")
    result = predictor("bus.jpg")            # Detections: boxes (xyxy, original pixels), scores, class_ids, names
    depth = load("depth", random_init=True)(frame_bgr)   # DepthMap: depth H x W float32

Importing this package is cheap: backends load their libraries when a predictor is made.
"""

from __future__ import annotations

__all__ = ["load", "Predictor", "Pipeline", "Detections", "DepthMap", "onnxruntime_providers"]


def __getattr__(name: str):
    if name == "load":
        from enginekit.runtime.loader import load

        return load
    if name in ("Predictor", "Pipeline"):
        from enginekit.runtime import predictor

        return getattr(predictor, name)
    if name in ("Detections", "DepthMap"):
        from enginekit.runtime import results

        return getattr(results, name)
    if name == "onnxruntime_providers":
        from enginekit.runtime.providers import onnxruntime_providers

        return onnxruntime_providers
    raise AttributeError(name)
