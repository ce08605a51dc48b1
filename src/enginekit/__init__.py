"""enginekit: PyTorch vision models to verified TensorRT engines.

The Python API mirrors the CLI verbs. Heavy libraries load on first use, so importing
enginekit stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "export", "build", "verify", "load"]


def __getattr__(name: str):
    if name in ("export", "build", "verify"):
        from enginekit import api

        return getattr(api, name)
    if name == "load":
        from enginekit.runtime.loader import load

        return load
    raise AttributeError(name)
