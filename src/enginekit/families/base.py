"""The model adapter (a family's one class) and the helpers families share (weights files, folder digests, seeding);
the plain types they hand out live in ``families.types``.

The export, verify and build stages and the runtime never branch on a family: they ask its adapter
for what ``families.interface`` declares (the module to export, inputs, tolerances, task metrics,
its processor).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from enginekit.hashing import sha256_file
from enginekit.compare.parts import OutputPart, Tolerance  # noqa: F401 - re-exported
from enginekit.errors import UsageError
from enginekit.families.interface import Evaluation, Export, Registration, Runtime
from enginekit.families.types import LoadedModel, NmsSettings, WeightsSource  # noqa: F401 - re-exported


def folder_sha256(folder: Path) -> str:
    """One digest of a model folder: relative paths and contents of every file."""
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(folder).as_posix().encode())
            h.update(sha256_file(f).encode())
    return h.hexdigest()


def check_weights_file(path: Path) -> WeightsSource:
    if not path.exists():
        raise UsageError(f"weights file not found: {path}")
    if not path.is_file():
        raise UsageError(f"weights path is not a file: {path}")
    return WeightsSource("file", str(path), sha256_file(path))


class ModelAdapter(Registration, Export, Evaluation, Runtime):
    """A model family: one class that declares what each job needs of it (``families.interface``).

    An instance serves one variant (``resolve("yolo12n")``); ``nms`` is the NMS put in its graph
    (``with_nms``), or None: the family's own outputs."""

    def __init__(self, variant: str):
        self.variant = variant
        self.nms: NmsSettings | None = None


def seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def describe_load_error(exc: BaseException, what: str) -> str:
    """One line from a loader exception, for messages that must not be tracebacks."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{what}: {text[:300]}"
