"""enginekit: PyTorch vision models to verified TensorRT engines.

The Python API mirrors the CLI verbs: ``export``, ``build``, ``verify``, ``load`` (see ``enginekit.api``).
They are real functions of this package, so no submodule can shadow them, and they import their
work on first call: importing enginekit stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "export", "build", "verify", "tune", "load"]


def export(*args, **kwargs):
    """PyTorch -> simplified ONNX, parity-checked: ``enginekit.api.export``."""
    from enginekit.api import export as run

    return run(*args, **kwargs)


def build(*args, **kwargs):
    """A model name or an ONNX file -> a cached TensorRT engine: ``enginekit.api.build``."""
    from enginekit.api import build as run

    return run(*args, **kwargs)


def verify(*args, **kwargs):
    """Engines and their ONNX artifacts against PyTorch: ``enginekit.api.verify``."""
    from enginekit.api import verify as run

    return run(*args, **kwargs)


def tune(*args, **kwargs):
    """The settings that meet a frame budget on this machine: ``enginekit.api.tune``."""
    from enginekit.api import tune as run

    return run(*args, **kwargs)


def load(*args, **kwargs):
    """A predictor over the best backend this machine can run: ``enginekit.api.load``."""
    from enginekit.api import load as run

    return run(*args, **kwargs)
