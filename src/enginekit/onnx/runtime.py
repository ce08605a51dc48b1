"""ONNX Runtime sessions: the one place they are set up (every executor of an ONNX graph comes here).

``session`` makes one over a file, a serialized model or a ModelProto, on the providers asked for
(the CPU by default), with enginekit's log level and, where asked, a number of intra-op threads.
Export parity, simplify, the repair search, verify, the runtime's and bench's ONNX Runtime
backends (``enginekit.backends.ort``) and doctor's provider probe all make their sessions here.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from enginekit.gpu import gpu_info
from enginekit.onnx.graph import MAX_IR_VERSION

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


@lru_cache(maxsize=1)
def providers() -> list[str]:
    """CPU, plus CUDA only where a GPU exists: asking for CUDA without one prints a loud error."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    chosen = [CPU]
    if CUDA in available and gpu_info() is not None:
        chosen.insert(0, CUDA)
    return chosen


_available = providers  # ``session``'s argument of that name hides the function


def options(*, threads: int | None = None, log_level: int = 4, dims: dict[str, int] | None = None):
    """Session options: ONNX Runtime's own log off but for fatal errors (level 4; an error it logs is raised as
    an exception too, which enginekit reports in one line), ``threads`` intra-op threads; ``dims``: named
    dynamic dimensions fixed to a size (the graph's shape computations fold to constants at load)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = log_level
    if threads:
        opts.intra_op_num_threads = threads
    for name, size in (dims or {}).items():
        opts.add_free_dimension_override_by_name(name, int(size))
    return opts


def session(model, *, cpu_only: bool = True, providers: list | None = None, threads: int | None = None,
            log_level: int = 4, dims: dict[str, int] | None = None):
    """An InferenceSession over ``model`` (a path, serialized bytes or a ModelProto).

    ``providers``: the providers in order of preference (entries may be ``(name, options)``);
    default: the CPU, or with ``cpu_only=False`` CUDA too where a GPU exists (``providers()``).
    A ModelProto's IR version is capped for ONNX Runtime. ``dims``: see ``options``.
    """
    import onnxruntime as ort

    if hasattr(model, "SerializeToString"):
        model.ir_version = min(model.ir_version, MAX_IR_VERSION)
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = str(Path(model))
    chosen = providers if providers is not None else ([CPU] if cpu_only else _available())
    opts = options(threads=threads, log_level=log_level, dims=dims)
    return ort.InferenceSession(model, sess_options=opts, providers=chosen)


def run(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def session_from_model(model):
    """A CPU session over an in-memory ModelProto (IR version capped for ONNX Runtime)."""
    return session(model)
