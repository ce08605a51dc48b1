"""enginekit: PyTorch vision models to verified TensorRT engines.

The Python API mirrors the CLI verbs: ``export``, ``build``, ``verify``, ``tune``, ``deploy``, ``predict``, ``load`` (``enginekit.api``'s
functions, with their real signatures), reached through the package on first use: importing enginekit stays
cheap. No submodule may take one of their names (``enginekit.build`` is the verb).
"""

from __future__ import annotations

from enginekit._version import __version__

__all__ = ["__version__", "export", "build", "verify", "tune", "deploy", "predict", "load"]


_VERBS = ("export", "build", "verify", "tune", "deploy", "predict", "load")


def __getattr__(name: str):
    """``enginekit.export`` and the other verbs: ``enginekit.api``'s functions (real signatures, ``help()`` lists
    every keyword), imported on first use so that ``import enginekit`` stays cheap."""
    if name in _VERBS:
        from enginekit import api

        return getattr(api, name)
    raise AttributeError(f"module 'enginekit' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_VERBS])
