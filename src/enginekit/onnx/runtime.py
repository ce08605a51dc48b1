"""ONNX Runtime sessions: the reference executor of every ONNX artifact."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np


@lru_cache(maxsize=1)
def providers() -> list[str]:
    """CPU, plus CUDA only where a GPU exists: asking for CUDA without one prints a loud error."""
    import onnxruntime as ort

    from enginekit.gpu import gpu_info

    available = ort.get_available_providers()
    chosen = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in available and gpu_info() is not None:
        chosen.insert(0, "CUDAExecutionProvider")
    return chosen


def session(path: Path, *, cpu_only: bool = True):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(
        str(path), sess_options=opts, providers=["CPUExecutionProvider"] if cpu_only else providers()
    )


def run(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def session_from_model(model):
    """A CPU session over an in-memory ModelProto (IR version capped for ONNX Runtime)."""
    import onnxruntime as ort

    from enginekit.onnx.graph import MAX_IR_VERSION

    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])
