"""Triton kernels made on first use, and where they run.

A module with Triton kernels (``exact_resize``'s letterbox, the queued decode's suppression) holds one
``LazyKernels``: the kernels are made (Triton imported, functions jitted) the first time a caller asks whether they run
on a device, never at import (importing Triton is slow, and it may be missing). They run for CUDA tensors, or for CPU
tensors under Triton's interpreter (``TRITON_INTERPRET=1``: how the suite checks them on a machine with no GPU). A
failure to make or launch them (no Triton, an old driver) is remembered: the caller's torch operations run from then
on, and ``broken`` says why.
"""

from __future__ import annotations

import os
from typing import Any, Callable


def interpreted() -> bool:
    """Triton's interpreter is on: kernels run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


class LazyKernels:
    """``make()`` -> the kernels, called once; ``usable(device)``, ``failed(exc)``, ``get()``."""

    def __init__(self, make: Callable[[], Any]):
        self._make = make
        self._made: Any = None
        #: why the kernels do not run here (empty while they do)
        self.broken: list[str] = []

    def get(self):
        if self._made is None:
            self._made = self._make()
        return self._made

    def usable(self, device) -> bool:
        """Whether the kernels run for tensors on ``device``: a CUDA device with Triton importable (or its
        interpreter, on the CPU), and no earlier failure on this machine."""
        if self.broken:
            return False
        if getattr(device, "type", str(device)) != "cuda" and not interpreted():
            return False
        try:
            self.get()
        except Exception as exc:  # noqa: BLE001 - no Triton, or one that cannot build: torch's operations instead
            self.failed(exc)
            return False
        return True

    def failed(self, exc: BaseException) -> None:
        """The kernels failed on this machine (compilation, an old driver): torch's operations from now on."""
        self.broken.append(f"{type(exc).__name__}: {exc}")
