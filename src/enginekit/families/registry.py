"""The registry families join by declaring themselves.

A family module decorates its adapter class with :func:`register`; the class says which names it
serves (``matches``), which short names point at it (``aliases``) and how ``enginekit models``
describes it (``describe``), and declares the rest of ``families.interface``. Nothing here knows a family: :func:`resolve` asks each registered
class whether a name is its own, so a new family is a new module and one line in
``FAMILY_MODULES``. Importing this module stays cheap (family modules import torch, ultralytics
or transformers inside their methods).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from enginekit.errors import UsageError
from enginekit.families.interface import check_declared
from enginekit.families.types import FamilyInfo  # noqa: F401 - re-exported: families declare themselves with it
from enginekit.families.torch_models.spec import FLAGS

if TYPE_CHECKING:
    from enginekit.families.base import ModelAdapter

#: modules whose import registers their families, in the order ``enginekit models`` lists them
FAMILY_MODULES = (
    "enginekit.families.ultralytics.yolo",
    "enginekit.families.ultralytics.rtdetr",
    "enginekit.families.depth_anything.family",
    "enginekit.families.torch_models.family",
)

_REGISTRY: list[type] = []


def register(cls: type) -> type:
    """Class decorator: add a family's adapter class to the registry (once), after checking that it
    declares what a family must (``families.interface.check_declared``: a TypeError names what is missing)."""
    check_declared(cls)
    if cls not in _REGISTRY:
        _REGISTRY.append(cls)
    return cls


def registered() -> list[type["ModelAdapter"]]:
    """Every registered adapter class, after importing the family modules."""
    for module in FAMILY_MODULES:
        importlib.import_module(module)
    return list(_REGISTRY)


def resolve(name: str, declared: dict | None = None) -> "ModelAdapter":
    """Adapter for a model name, or a one-line UsageError saying what is known. ``declared``: what the user
    declares of the model (``--task``, ``--outputs``...), for a family that takes it (``declarable``)."""
    classes = registered()
    given = name.strip()
    found = model_in_file(given)  # best.pt: the model it holds, no name needed
    if found is not None:
        if declared and not found.declarable:
            said = ", ".join(FLAGS.get(k, k) for k in declared)
            raise UsageError(f"{Path(given).name} holds its model, which says itself what its outputs are and how its "
                             f"inputs are made: drop {said}")
        return found
    lowered = given.lower()
    aliases = {alias: target for cls in classes for alias, target in cls.aliases.items()}
    canonical = aliases.get(lowered, lowered)
    hits = [cls for cls in classes if cls.matches(given if cls.keeps_case else canonical)]
    if len(hits) == 1:
        cls = hits[0]
        if declared and not cls.declarable:
            said = ", ".join(FLAGS.get(k, k) for k in declared)
            raise UsageError(f"{canonical} is a {cls.family} model, which says itself what its outputs are and how "
                             f"its inputs are made: {said} apply to torchvision:, timm:, file.py:factory, "
                             "module:factory and saved-program models")
        return cls.create(given if cls.keeps_case else canonical, declared or {})
    if len(hits) > 1:  # two families claiming one name is a bug of theirs, not the user's
        raise RuntimeError(f"{canonical!r} is claimed by {', '.join(c.__name__ for c in hits)}")
    for cls in classes:
        hint = cls.near_miss(canonical)
        if hint:
            raise UsageError(f"unknown model {name!r}: {hint}; `enginekit models` lists them")
    examples = ", ".join(cls.example for cls in classes if cls.example)
    raise UsageError(f"unknown model {name!r}: expected a name like {examples}; `enginekit models` lists them")


def recorded_declaration(metadata: dict) -> dict:
    """What a graph's metadata records of its model's declaration (``declaration``, JSON), or {}."""
    import json

    text = (metadata or {}).get("declaration")
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as cause:
        raise UsageError(f"the graph's model declaration is not JSON: {text[:80]!r}") from cause
    return value if isinstance(value, dict) else {}


def model_in_file(path) -> "ModelAdapter | None":
    """The adapter of the model a weights file holds whole (an Ultralytics checkpoint: its module), asked of every
    family (``from_file``); None: no family's file, or not a file."""
    path = Path(str(path)).expanduser()
    if path.suffix.lower() not in (".pt", ".pth") or not path.is_file():
        return None
    for cls in registered():
        found = cls.from_file(path)
        if found is not None:
            return found
    return None


def graph_metadata(metadata: dict[str, str], source: str | None = None) -> dict[str, str]:
    """A graph's metadata as enginekit reads it: its own as it is; another tool's (an Ultralytics export) as the
    family whose library wrote it translates it (``adopt_metadata``); else as it is. ``source``: the file's name,
    which a refusal of its metadata starts with."""
    if not metadata or metadata.get("model"):
        return metadata
    for cls in registered():
        try:
            adopted = cls.adopt_metadata(metadata)
        except UsageError as exc:
            if source is None:
                raise
            raise UsageError(f"{source}: {exc}") from exc
        if adopted is not None:
            return adopted
    return metadata


def model_of_metadata(metadata: dict | None) -> "ModelAdapter | None":
    """The adapter of a model a graph's metadata describes by what it is (``from_metadata``), else None."""
    for cls in registered():
        found = cls.from_metadata(metadata or {})
        if found is not None:
            return found
    return None


def resolve_recorded(name: str | None, metadata: dict) -> "ModelAdapter":
    """The adapter of a graph or engine: what its metadata says the model is, where it says so (a checkpoint's
    export, a file Ultralytics wrote: ``from_metadata``), else the model it names (``model``) with the declaration
    its metadata records."""
    found = model_of_metadata(metadata)
    if found is not None:
        return found
    if not name:
        raise UsageError("the graph does not say which model it is")
    return resolve(name, recorded_declaration(metadata))


def families() -> list[FamilyInfo]:
    """What ``enginekit models`` shows: one row per registered family."""
    return [cls.describe() for cls in registered()]


def graph_model(path) -> "tuple[ModelAdapter, dict[str, str]] | None":
    """(the adapter, the metadata) of an ONNX file's model, from its metadata (enginekit's, or Ultralytics' adopted);
    None: not an ONNX file. A graph that does not say which model it is: one line."""
    path = Path(str(path)).expanduser()
    if path.suffix.lower() != ".onnx":
        return None
    from enginekit.onnx.graph import get_metadata, load_model

    if not path.is_file():
        raise UsageError(f"ONNX file not found: {path}")
    meta = graph_metadata(get_metadata(load_model(path, check=False)), path.name)
    if not meta.get("model") and model_of_metadata(meta) is None:
        raise UsageError(f"{path.name} does not say which model it is: enginekit runs the graphs it or Ultralytics "
                         "wrote")
    return resolve_recorded(meta.get("model"), meta), meta


def resolve_any(target: str) -> "ModelAdapter":
    """The adapter of what a verb was given: a model name, a checkpoint, or an ONNX file (its metadata)."""
    found = graph_model(target)
    return found[0] if found is not None else resolve(target)
