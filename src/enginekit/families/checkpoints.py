"""Loading Ultralytics ``.pt`` checkpoints without running code from the file.

An Ultralytics checkpoint is a pickle of the model object (``{"model": DetectionModel, ...}``).
Unpickling an arbitrary pickle can call any function the file names (``os.system`` included), so
by default enginekit reads checkpoints with PyTorch's ``weights_only`` unpickler and an allowlist
built from what Ultralytics checkpoints are made of:

- the ``torch.nn.Module`` classes of ``torch.nn.modules``, ``ultralytics.nn.modules`` and
  ``ultralytics.nn.tasks`` (the layers and the model classes);
- the plain-data types a trainer writes beside the model (``IterableSimpleNamespace``,
  ``SimpleNamespace``, paths, numpy scalars and dtypes);
- the few loss/assigner classes a training checkpoint may keep on the model;
- ``getattr`` restricted to public methods of allowed modules (a model whose ``forward`` was
  replaced by another of its methods pickles that bound method through ``getattr``).

The file's globals are listed before anything is unpickled (``get_unsafe_globals_in_checkpoint``),
so a checkpoint naming anything else is refused with one line naming the file and the first
refused global, and nothing from it runs. A user who trusts a file opts in with
``--trust-checkpoint`` or ``ENGINEKIT_TRUST_CHECKPOINTS=1``; then Ultralytics' own loader reads it.
State dicts and safetensors never need this (the Depth-Anything loaders read them with
``weights_only=True`` and no extra globals).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
import os
import pkgutil
import re
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from enginekit.errors import UsageError

TRUST_ENV = "ENGINEKIT_TRUST_CHECKPOINTS"
TRUST_FLAG = "--trust-checkpoint"

_TRUST: contextvars.ContextVar[bool | None] = contextvars.ContextVar("trust_checkpoints", default=None)
_LOCK = threading.Lock()
_REGISTRY: dict[str, Any] | None = None
_REGISTERED: set[str] = set()

# Module paths of checkpoints written by older Ultralytics releases -> where the code lives now
# (the same renames Ultralytics' own loader applies).
_LEGACY_MODULES = {
    "ultralytics.yolo.utils": "ultralytics.utils",
    "ultralytics.yolo.v8": "ultralytics.models.yolo",
    "ultralytics.yolo.data": "ultralytics.data",
}
_LEGACY_NAMES = {
    "ultralytics.nn.modules.block.Silence": "torch.nn.modules.linear.Identity",  # YOLOv9e
    "ultralytics.nn.tasks.YOLOv10DetectionModel": "ultralytics.nn.tasks.DetectionModel",
}
# Plain classes (not nn.Modules) a training checkpoint may keep on the model (its criterion).
_PLAIN_CLASS_MODULES = ("ultralytics.utils.loss", "ultralytics.utils.tal", "ultralytics.utils.metrics")
_UNSUPPORTED_GLOBAL_RE = re.compile(r"GLOBAL ([\w.]+)")
_UNBUILDABLE_RE = re.compile(r"but got <class '([\w.]+)'>")


# --------------------------------------------------------------------------- opting in


def trust_requested(trust: bool | None = None) -> bool:
    """Whether checkpoints may be unpickled without the allowlist: ``trust`` if given, else the
    ``trusting()`` context, else ``ENGINEKIT_TRUST_CHECKPOINTS`` (1/true/yes)."""
    if trust is not None:
        return trust
    ctx = _TRUST.get()
    if ctx is not None:
        return ctx
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def trusting(trust: bool = True) -> Iterator[None]:
    """Within the block, load checkpoints as trusted (or not): the ``--trust-checkpoint`` flag."""
    token = _TRUST.set(trust)
    try:
        yield
    finally:
        _TRUST.reset(token)


# --------------------------------------------------------------------------- the allowlist


def _safe_getattr(obj: Any, name: str) -> Any:
    """``getattr`` as a checkpoint may use it: a public method of an allowed module object."""
    import torch

    registry = _registry()
    if (
        isinstance(name, str)
        and not name.startswith("_")
        and isinstance(obj, torch.nn.Module)
        and type(obj) in registry.values()
        and callable(getattr(type(obj), name, None))
    ):
        return getattr(obj, name)
    raise RuntimeError(f"getattr({type(obj).__name__}, {name!r}) is not allowed in a checkpoint")


def _module_classes(package: str, base: type) -> dict[str, type]:
    """Subclasses of ``base`` defined in ``package`` and its submodules, by qualified name."""
    found: dict[str, type] = {}
    root = importlib.import_module(package)
    modules = [root]
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=package + "."):
        try:
            modules.append(importlib.import_module(info.name))
        except Exception:  # noqa: BLE001 - an optional submodule whose extra is missing
            continue
    for module in modules:
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, base) and obj.__module__.startswith(package):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def _build_registry() -> dict[str, Any]:
    import collections
    import pathlib
    import types

    import numpy as np
    import torch

    registry: dict[str, Any] = {}
    for package in ("torch.nn.modules", "ultralytics.nn.modules", "ultralytics.nn.tasks"):
        registry.update(_module_classes(package, torch.nn.Module))
    for package in _PLAIN_CLASS_MODULES:
        with contextlib.suppress(ImportError):
            module = importlib.import_module(package)
            for _, obj in inspect.getmembers(module, inspect.isclass):
                if obj.__module__ == package:
                    registry[f"{package}.{obj.__qualname__}"] = obj
    from ultralytics.utils import IterableSimpleNamespace

    plain: list[Any] = [
        IterableSimpleNamespace,
        types.SimpleNamespace,
        collections.OrderedDict,
        collections.defaultdict,
        pathlib.PurePosixPath,
        pathlib.PosixPath,
        pathlib.PurePath,
        pathlib.Path,
        torch.Size,
        torch.dtype,
        np.dtype,
        np.ndarray,
    ]
    for obj in plain:
        registry[f"{obj.__module__}.{obj.__qualname__}"] = obj
    # numpy scalars and arrays pickle through these reconstructors and dtype classes.
    core = getattr(np, "_core", None) or np.core
    registry["numpy._core.multiarray.scalar"] = core.multiarray.scalar
    registry["numpy.core.multiarray.scalar"] = core.multiarray.scalar
    registry["numpy._core.multiarray._reconstruct"] = core.multiarray._reconstruct
    registry["numpy.core.multiarray._reconstruct"] = core.multiarray._reconstruct
    registry["numpy.dtype"] = np.dtype
    for name in dir(np.dtypes):
        obj = getattr(np.dtypes, name)
        if isinstance(obj, type) and issubclass(obj, np.dtype):
            registry[f"numpy.dtypes.{name}"] = obj
    registry["builtins.getattr"] = _safe_getattr
    # Older releases' names for the same classes.
    for old, new in _LEGACY_NAMES.items():
        if new in registry:
            registry[old] = registry[new]
    for name, obj in list(registry.items()):
        for new_mod, old_mod in ((n, o) for o, n in _LEGACY_MODULES.items()):
            if name.startswith(new_mod + "."):
                registry[old_mod + name[len(new_mod):]] = obj
    return registry


def _add_torchvision_transforms(registry: dict[str, Any]) -> None:
    """Classification checkpoints may keep their preprocessing: torchvision's plain transforms
    (imported only for the files that name them)."""
    try:
        import torchvision.transforms.transforms as tvt
        from torchvision.transforms.functional import InterpolationMode
    except ImportError:
        return
    for obj in (tvt.Compose, tvt.Normalize, tvt.Resize, tvt.CenterCrop, tvt.ToTensor, InterpolationMode):
        registry[f"{obj.__module__}.{obj.__qualname__}"] = obj


def _registry() -> dict[str, Any]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _build_registry()
    return _REGISTRY


def allowed_globals() -> frozenset[str]:
    """Every global name a checkpoint may reference (for tests and ``doctor``)."""
    return frozenset(_registry())


# --------------------------------------------------------------------------- loading


def _refusal(path: Path, name: str, more: int = 0) -> UsageError:
    extra = f" (and {more} more)" if more else ""
    return UsageError(
        f"refused to load {path}: it references {name}{extra}, which is not among the classes an "
        f"Ultralytics checkpoint is made of, and unpickling it could run code from the file; if you "
        f"trust this file, pass {TRUST_FLAG} (or set {TRUST_ENV}=1)"
    )


def safe_load(path: Path) -> Any:
    """``torch.load`` of an Ultralytics checkpoint through the ``weights_only`` unpickler.

    Raises ``UsageError`` (one line) for a file naming a global outside the allowlist, before
    anything from it is unpickled where the format allows listing its globals.
    """
    import pickle

    import torch

    path = Path(path)
    registry = _registry()
    try:
        needed = list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    except ValueError:
        needed = []  # not a zip archive: the restricted unpickler below still refuses globals
    except Exception as exc:  # noqa: BLE001 - a damaged archive
        raise UsageError(f"cannot read checkpoint {path}: {_first_line(exc)}") from exc
    if any(name.startswith("torchvision.transforms.") for name in needed):
        _add_torchvision_transforms(registry)
    refused = [name for name in needed if name not in registry]
    if refused:
        raise _refusal(path, refused[0], len(refused) - 1)
    with _LOCK:
        # add_safe_globals is process-wide and cheap to keep; register only what this file
        # names, since the unpickler rebuilds its lookup from the registered set per opcode.
        if any(name.startswith("numpy.") for name in needed):
            # numpy scalars name their dtype's class only when built, not in the global scan
            needed += [name for name in registry if name.startswith("numpy.dtypes.")]
        new = [name for name in needed if name not in _REGISTERED]
        if new:
            torch.serialization.add_safe_globals([(registry[name], name) for name in new])
            _REGISTERED.update(new)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on pickle protocols: not the user's
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        match = _UNSUPPORTED_GLOBAL_RE.search(str(exc)) or _UNBUILDABLE_RE.search(str(exc))
        if match:
            raise _refusal(path, match.group(1)) from exc
        raise UsageError(f"{path} is not a PyTorch checkpoint ({_torch_reason(exc)})") from exc
    except Exception as exc:  # noqa: BLE001 - truncated, empty, a text file...
        raise UsageError(f"{path} is not a PyTorch checkpoint ({_torch_reason(exc)})") from exc


def load_ultralytics_model(path: Path, *, trust: bool | None = None):
    """The FP32 eval-mode model of an Ultralytics checkpoint, as Ultralytics' ``load_checkpoint``
    returns it; loaded safely unless ``trust_requested(trust)``."""
    path = Path(path)
    if trust_requested(trust):
        from ultralytics.nn.tasks import load_checkpoint

        return load_checkpoint(str(path))[0]

    import torch
    from ultralytics.cfg import DEFAULT_CFG_DICT
    from ultralytics.nn.tasks import guess_model_task

    ckpt = safe_load(path)
    if isinstance(ckpt, torch.nn.Module):
        candidate, train_args = ckpt, {}
    elif isinstance(ckpt, dict):
        candidate = ckpt.get("ema") or ckpt.get("model")
        train_args = ckpt.get("train_args") or {}
    else:
        raise UsageError(f"{path} holds a {type(ckpt).__name__}, not an Ultralytics checkpoint")
    if not isinstance(candidate, torch.nn.Module):
        what = "a state dict" if isinstance(ckpt, dict) and all(
            isinstance(v, torch.Tensor) for v in ckpt.values()
        ) else "no model object"
        raise UsageError(
            f"{path} is not an Ultralytics checkpoint: it holds {what} (expected a 'model' or 'ema' entry)"
        )
    if not isinstance(train_args, dict):
        train_args = dict(vars(train_args)) if hasattr(train_args, "__dict__") else {}
    model = candidate.float()
    model.args = {**DEFAULT_CFG_DICT, **train_args}
    model.pt_path = str(path)
    model.task = getattr(model, "task", None) or guess_model_task(model)
    if not hasattr(model, "stride"):
        model.stride = torch.tensor([32.0])
    model = model.eval()
    for m in model.modules():
        if hasattr(m, "inplace"):
            m.inplace = True
        elif isinstance(m, torch.nn.Upsample) and not hasattr(m, "recompute_scale_factor"):
            m.recompute_scale_factor = None
    return model


def _torch_reason(exc: BaseException) -> str:
    """The informative part of a torch.load error (its unpickler's words, not the boilerplate)."""
    text = str(exc)
    match = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    if match:
        return match.group(1).strip().splitlines()[0][:200]
    return _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
