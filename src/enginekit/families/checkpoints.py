"""Loading Ultralytics ``.pt`` checkpoints without running code from the file.

An Ultralytics checkpoint is a pickle of the model object (``{"model": DetectionModel, ...}``).
Unpickling an arbitrary pickle can call any function the file names (``os.system`` included), so
by default enginekit reads checkpoints with PyTorch's ``weights_only`` unpickler and an allowlist
built from what Ultralytics checkpoints are made of:

- the ``torch.nn.Module`` classes of ``torch.nn.modules``, ``ultralytics.nn.modules`` and
  ``ultralytics.nn.tasks`` (the layers and the model classes);
- the plain-data types a trainer writes beside the model (``IterableSimpleNamespace``,
  ``SimpleNamespace``, paths, numpy scalars and dtypes);
- the few loss/assigner classes a training checkpoint may keep on the model, and the classify transforms
  (torchvision's; 8.0.x also Ultralytics' own ``CenterCrop``/``ToTensor``) a classifier may keep;
- ``getattr`` restricted to public methods of allowed modules (a model whose ``forward`` was
  replaced by another of its methods pickles that bound method through ``getattr``) and public functions of
  allowed classes (releases 8.0 to 8.3 keep ``self.detect = Detect.forward`` on their Segment and Pose heads,
  which protocol 2 pickles as ``getattr(Detect, 'forward')``): data for the unpickler, never called by it.

The file's globals are listed before anything is unpickled (``get_unsafe_globals_in_checkpoint``),
so a checkpoint naming anything else is refused with one line naming the file and the first
refused global (or the refused ``getattr``), and nothing from it runs; a file ``torch.load`` reads is never
called "not a checkpoint". After loading, one forward pass on a small input checks that this Ultralytics can
run the file's layers (``check_runs``: a fork's file loads and fails there, exit 3). A user who trusts a file opts in with
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

from enginekit.errors import CapabilityError, UsageError

TRUST_ENV = "ENGINEKIT_TRUST_CHECKPOINTS"
TRUST_FLAG = "--trust-checkpoint"

_TRUST: contextvars.ContextVar[bool | None] = contextvars.ContextVar("trust_checkpoints", default=None)
_LOCK = threading.Lock()
_REGISTRY: dict[str, Any] | None = None
_REGISTERED: set[str] = set()
_TYPES: set | None = None

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
_REFUSED_GETATTR_RE = re.compile(r"(getattr\(\w+, '[^']*'\)) is not allowed in a checkpoint")


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


class RefusedAttribute(RuntimeError):
    """A ``getattr`` in a checkpoint that the allowlist does not allow (raised inside the unpickler)."""


def _safe_getattr(obj: Any, name: str) -> Any:
    """``getattr`` as checkpoints use it: a public method of an allowed module object (a model whose ``forward`` was
    replaced by another of its methods pickles that bound method), or a public function of an allowed class (releases
    8.0 to 8.3 keep ``self.detect = Detect.forward`` on their Segment and Pose heads, which pickle protocol 2, torch.save's
    default, stores as ``getattr(Detect, 'forward')``). Anything else is refused: the unpickler can only call what the
    allowlist holds, so what this returns is data, never run."""
    import torch

    public = isinstance(name, str) and bool(name) and not name.startswith("_")
    if public and isinstance(obj, torch.nn.Module) and type(obj) in _allowed_types() \
            and callable(getattr(type(obj), name, None)):
        return getattr(obj, name)
    if public and isinstance(obj, type) and obj in _allowed_types():
        value = getattr(obj, name, None)
        if inspect.isfunction(value) or inspect.ismethod(value):
            return value
    owner = obj.__name__ if isinstance(obj, type) else type(obj).__name__
    raise RefusedAttribute(f"getattr({owner}, {name!r}) is not allowed in a checkpoint")


def _allowed_types() -> set:
    """The allowlist's classes (for ``getattr``'s checks)."""
    global _TYPES
    if _TYPES is None:
        _TYPES = {obj for obj in _registry().values() if isinstance(obj, type)}
    return _TYPES


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
    global _TYPES
    for obj in (tvt.Compose, tvt.Normalize, tvt.Resize, tvt.CenterCrop, tvt.ToTensor, InterpolationMode):
        registry[f"{obj.__module__}.{obj.__qualname__}"] = obj
    try:  # releases 8.0.x kept Ultralytics' own classify transforms beside torchvision's (plain objects, no code)
        from ultralytics.data import augment
    except ImportError:
        return
    for name in ("CenterCrop", "ToTensor", "ClassifyLetterBox"):
        obj = getattr(augment, name, None)
        if isinstance(obj, type):
            registry[f"ultralytics.data.augment.{name}"] = obj
    _TYPES = None


def _registry() -> dict[str, Any]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _build_registry()
    return _REGISTRY


def allowed_globals() -> frozenset[str]:
    """Every global name a checkpoint may reference (for tests and ``doctor``)."""
    return frozenset(_registry())


# --------------------------------------------------------------------------- loading


def _refusal(path: Path, name: str, more: int = 0, *, call: bool = False) -> UsageError:
    extra = f" (and {more} more)" if more else ""
    what = (f"it calls {name}, which the classes an Ultralytics checkpoint is made of do not need" if call else
            f"it references {name}{extra}, which is not among the classes an Ultralytics checkpoint is made of")
    return UsageError(
        f"refused to load {path}: {what}, and unpickling it could run code from the file; if you "
        f"trust this file, pass {TRUST_FLAG} (or set {TRUST_ENV}=1)"
    )


def _unreadable(path: Path, exc: BaseException) -> UsageError:
    """A file the weights-only unpickler refuses for another reason than a global (an opcode, a call it does not
    build): torch.load may read it, so it is refused, not called "not a checkpoint"."""
    return UsageError(f"refused to load {path}: the weights-only unpickler cannot build it ({_torch_reason(exc)}), "
                      f"and unpickling it otherwise could run code from the file; if you trust this file, pass "
                      f"{TRUST_FLAG} (or set {TRUST_ENV}=1)")


def describe_torch_file(path: Path) -> str:
    """What a file given as a PyTorch file is, in a phrase, read without unpickling anything that could run code:
    "empty (0 bytes)", "a truncated zip archive", "a TorchScript program", "a state dict of 12 tensors", "a whole
    MobileNetV3 module pickled by torch.save(model)", "an Ultralytics checkpoint", "not a zip archive or a pickle"."""
    import zipfile

    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        return f"unreadable ({exc.strerror or type(exc).__name__})"
    if size == 0:
        return "empty (0 bytes)"
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return f"a truncated or damaged zip archive ({size} bytes)"
        if bad is not None:
            return f"a damaged zip archive (member {bad} does not match its checksum)"
        if any("/code/" in n for n in names) and any(n.endswith("constants.pkl") for n in names):
            return "a TorchScript program"
        if any("serialized_exported_program" in n for n in names):
            return "a torch.export program"
        if not any(n.endswith("data.pkl") for n in names):
            return "a zip archive torch.save did not write (no data.pkl)"
        return _describe_pickle(path)
    if head[:1] == b"\x80":
        return _describe_pickle(path)
    if head.lstrip()[:1] in (b"{", b"[", b"#") or all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return "a text file, not a PyTorch file"
    return "not a zip archive or a pickle (not a file torch.save writes)"


def state_dict_refusal(path: Path, wanted: str, exc: BaseException | None = None) -> UsageError:
    """One line for a file given as weights (``-w``) that torch reads as something else than ``wanted`` (a state dict):
    what it is, and the command or step that works. A safetensors file: what its reader said (``exc``)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return UsageError(f"cannot read {path.name} as {wanted}: {_first_line(exc) if exc else 'unreadable'}")
    what = describe_torch_file(path)
    if what == "an Ultralytics checkpoint":
        try:
            model = load_ultralytics_model(path)
            names = getattr(model, "names", None) or {}
            what = (f"an Ultralytics checkpoint (a {getattr(model, 'task', 'detect')} model, {len(names)} "
                    f"class{'es' if len(names) != 1 else ''})")
        except Exception:  # noqa: BLE001 - the file's own refusal comes when it is given alone
            pass
        return UsageError(f"{path.name} is {what}, not {wanted}: give the file alone (enginekit export {path.name}), "
                          "which needs no name")
    if what.startswith("a whole "):
        return UsageError(f"{path.name} is {what}, not {wanted}, and unpickling it could run code from the file: save "
                          f"its weights with torch.save(model.state_dict(), \"{path.name}\") and pass that file")
    return UsageError(f"cannot read {path.name} as {wanted}: it is {what}")


def _describe_pickle(path: Path) -> str:
    """A torch.save file, by the globals it names (listed without unpickling) and, where it names none that could
    run code, by what it holds."""
    import torch

    # every global the pickle names, in order (the unsafe-globals list leaves out what this process allowed already)
    names = _globals_in_order(path)
    if not names:
        try:
            names = list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
        except Exception:  # noqa: BLE001 - a legacy pickle or a damaged archive
            names = None
    if names and any(n.startswith("ultralytics.") for n in names):
        return "an Ultralytics checkpoint"
    modules = [n for n in names or () if _is_module_class(n)]
    if modules:  # the first a pickle names is its root object's class (the model; its layers come after)
        return f"a whole {modules[0].rsplit('.', 1)[-1]} module pickled by torch.save(model) ({modules[0]})"
    plain = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter",
             "torch.FloatStorage", "torch.HalfStorage", "torch.LongStorage", "torch.IntStorage", "torch.BoolStorage",
             "torch.DoubleStorage", "torch.ByteStorage", "torch.BFloat16Storage"}
    names = [n for n in names or () if n not in plain and not n.startswith(("torch._utils.", "torch.storage"))]
    if names:
        return f"a pickle that names {names[0]}" + (f" and {len(names) - 1} more globals" if len(names) > 1 else "")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        return f"a file torch.load cannot read ({_torch_reason(exc)})"
    if isinstance(obj, dict):
        tensors = [v for v in obj.values() if isinstance(v, torch.Tensor)]
        if obj and len(tensors) == len(obj):
            return f"a state dict of {len(tensors)} tensors"
        for key in ("state_dict", "model_state_dict", "model", "ema"):
            if isinstance(obj.get(key), dict):
                return f"a dict whose {key!r} entry is a state dict"
        return f"a dict of {', '.join(map(repr, list(obj)[:4]))}{' ...' if len(obj) > 4 else ''}"
    return f"a pickled {type(obj).__name__}"


def _globals_in_order(path: Path) -> list[str]:
    """The globals a torch.save zip's pickle names, in the order it names them (read with pickletools: nothing is
    unpickled); [] where it cannot be read so."""
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            member = next(n for n in z.namelist() if n.endswith("data.pkl"))
            data = z.read(member)
        found, strings = [], []
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
            if isinstance(arg, str) and "UNICODE" in op.name:
                strings.append(arg)
        return list(dict.fromkeys(found))
    except Exception:  # noqa: BLE001 - not a zip, no pickle, an opcode pickletools does not know
        return []


def _is_module_class(name: str) -> bool:
    """Whether a global a pickle names is a ``torch.nn.Module`` class (imported only for torch and torchvision,
    whose import runs no code from the file)."""
    import torch

    module, _, attr = name.rpartition(".")
    if not module.startswith(("torch.", "torchvision.", "timm.")):
        return False
    try:
        obj = getattr(importlib.import_module(module), attr, None)
    except Exception:  # noqa: BLE001
        return False
    return isinstance(obj, type) and issubclass(obj, torch.nn.Module)


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
        raise UsageError(f"{path} is not a PyTorch checkpoint: it is {describe_torch_file(path)}") from exc
    if any(name.startswith(("torchvision.transforms.", "ultralytics.data.augment.")) for name in needed):
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
    except RefusedAttribute as exc:  # raised by the allowlist's getattr inside the unpickler, as it is
        called = _REFUSED_GETATTR_RE.search(str(exc))
        raise _refusal(path, called.group(1) if called else str(exc), call=True) from exc
    except pickle.UnpicklingError as exc:
        text = str(exc)
        called = _REFUSED_GETATTR_RE.search(text)
        if called:
            raise _refusal(path, called.group(1), call=True) from exc
        match = _UNSUPPORTED_GLOBAL_RE.search(text) or _UNBUILDABLE_RE.search(text)
        if match:
            raise _refusal(path, match.group(1)) from exc
        raise _unreadable(path, exc) from exc
    except Exception as exc:  # noqa: BLE001 - truncated, empty, a text file...
        raise UsageError(f"{path} is not a PyTorch checkpoint: it is {describe_torch_file(path)}") from exc


def load_ultralytics_model(path: Path, *, trust: bool | None = None):
    """The FP32 eval-mode model of an Ultralytics checkpoint, as Ultralytics' ``load_checkpoint``
    returns it; loaded safely unless ``trust_requested(trust)``."""
    path = Path(path)
    if trust_requested(trust):
        from ultralytics.nn.tasks import load_checkpoint

        return check_runs(load_checkpoint(str(path))[0], path)

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
    if isinstance(ckpt, dict) and ckpt.get("modelopt"):  # trained quantization-aware: its quantizers put back
        restore_quantizers(model, ckpt["modelopt"], path)
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
    return check_runs(model, path)


def restore_quantizers(model, state, path: Path) -> None:
    """A checkpoint Ultralytics trained quantization-aware (``model.train(..., quantize=8)``, through ModelOpt) keeps
    its model without quantizers and, beside it under ``"modelopt"``, ModelOpt's state and the trained ranges:
    Ultralytics' ``restore_qat`` puts them back (as its ``load_checkpoint`` does), so the model computes as it was
    trained (fake-quantized INT8) and exports as its Q/DQ graph. Without ModelOpt's torch side: exit 3."""
    try:
        from ultralytics.utils.torch_utils import restore_qat
    except ImportError as exc:
        raise CapabilityError(f"{path} was trained quantization-aware (Ultralytics quantize=8); this Ultralytics "
                              "cannot restore its quantizers (it has no restore_qat: Ultralytics 8.4 or later)") from exc
    import io

    try:  # ModelOpt prints what it inserts ("Inserted 308 quantizers"): the library never prints, stdout is the user's
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            restore_qat(model, state)
    except ImportError as exc:
        raise CapabilityError(f"{path} was trained quantization-aware (Ultralytics quantize=8): restoring its "
                              f"quantizers needs nvidia-modelopt's torch side ({_first_line(exc)})") from exc
    except Exception as exc:  # noqa: BLE001 - a state of another ModelOpt, or of another model
        raise UsageError(f"{path} was trained quantization-aware (Ultralytics quantize=8), but its quantization state "
                         f"does not restore onto its model: {_first_line(exc)}") from exc


def is_qat_checkpoint(path: Path) -> bool:
    """Whether the checkpoint at ``path`` was trained quantization-aware (its ``"modelopt"`` entry), read through the
    safe unpickler; False for anything that is not a readable checkpoint (its load says why)."""
    try:
        ckpt = safe_load(Path(path))
    except Exception:  # noqa: BLE001 - the export that follows refuses it in one line
        return False
    return isinstance(ckpt, dict) and bool(ckpt.get("modelopt"))


def is_quantization_aware(model) -> bool:
    """Whether ``model`` carries the fake quantizers of a quantization-aware trained checkpoint (ModelOpt's
    ``TensorQuantizer``, matched by name as Ultralytics' ``is_qat`` does: nothing imports ModelOpt for it)."""
    return any(type(m).__name__ == "TensorQuantizer" for m in model.modules())


def check_runs(model, path: Path):
    """``model`` once it has run one forward pass, as Ultralytics runs it; a one-line ``CapabilityError`` (exit 3)
    where this Ultralytics cannot run the file's layers (a fork's checkpoint: its classes load, their forward needs
    attributes this release's do not have; or a newer release's), before anything is exported or cached.

    The trial runs at twice the model's largest stride (a second, at the size it was trained at, where that
    fails, so that no model is refused for the trial's size)."""
    import torch

    try:
        stride = int(max(model.stride.tolist())) if hasattr(model, "stride") else 32
    except (AttributeError, TypeError, ValueError):
        stride = 32
    spec = getattr(model, "yaml", None)
    channels = int(spec.get("channels", 3) or 3) if isinstance(spec, dict) else 3
    args = getattr(model, "args", None)
    trained = args.get("imgsz") if isinstance(args, dict) else None
    sizes = [max(2 * stride, 64)]
    if isinstance(trained, int) and trained > sizes[0] and not trained % stride:
        sizes.append(trained)
    first: BaseException | None = None
    for size in sizes:
        try:
            with torch.no_grad():
                model(torch.zeros(1, channels, size, size))
            return model
        except Exception as exc:  # noqa: BLE001 - whatever the layers raise
            first = first or exc
    import ultralytics

    raise CapabilityError(f"this Ultralytics ({ultralytics.__version__}) cannot run the layers of {path.name} "
                          f"({_layer_failure(first)}): the file may come from a fork or a newer release")


def _layer_failure(exc: BaseException) -> str:
    """What a layer's forward raised, in a few words: "AAttn has no attribute qkv"."""
    text = _first_line(exc)
    found = re.match(r"'(\w+)' object has no attribute '(\w+)'", text)
    if found:
        return f"{found[1]} has no attribute {found[2]}"
    return f"{type(exc).__name__}: {text[:160]}"


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
