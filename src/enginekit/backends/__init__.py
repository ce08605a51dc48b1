"""Backends: the ways enginekit runs a model, one small class each behind one protocol.

    base.py       the protocol (Polygraphy's BaseRunner: activate, infer, deactivate; plus what a backend
                  runs, where, what it needs, why not here), SessionInfo, Artifact
    registry.py   every backend, one line each; variants bench times; what ``auto`` tries
    pytorch.py    torch: the loaded module (FP16 and CUDA graphs on a GPU); capture_graph
    ort.py        onnxruntime-cpu, onnxruntime-cuda (I/O binding, CUDA graph, fused attention)
    tensorrt.py   tensorrt: engine plans through enginekit.trt (TensorRT 10/11, TensorRT-RTX)
    providers.py  which ONNX Runtime execution providers load here
    timing.py     bench's Runner and clocks

The runtime (``load``/``predict``), bench, verify and doctor take their backends from the registry.
Importing this package imports no numpy, onnxruntime, torch or tensorrt: ``enginekit --help`` reads the registry
(its names and ranks) when it starts, so the enginekit modules a backend needs to run (the cache, ``onnx``, ``trt``,
the families' processing, which import numpy) are imported inside the methods that run it, the one package besides
``cli/`` where internal imports are not at the top (tests/test_layout.py reads them all the same).
"""

from __future__ import annotations

from enginekit.backends.base import ENGINE, MODULE, ONNX, Artifact, Backend, SessionInfo, Verdict
from enginekit.backends.registry import (
    AUTO,
    Variant,
    auto_order,
    backends,
    choices,
    get,
    names,
    register,
    running,
    unregister,
    variants,
    verifier,
)

__all__ = ["AUTO", "ENGINE", "MODULE", "ONNX", "Artifact", "Backend", "SessionInfo", "Variant", "Verdict",
           "auto_order", "backends", "choices", "get", "names", "register", "running", "unregister", "variants",
           "verifier"]
