"""Where a PyTorch model comes from, and how it is built, identified and given its weights.

A model reference names one of:

- ``torchvision:NAME``: a model torchvision builds by name (``torchvision.models.get_model``);
- ``timm:NAME``: a model timm builds by name (``timm.create_model``);
- ``path/to/file.py:factory``: a function (or class) in a Python file, called with no arguments;
- ``package.module:factory``: the same in an importable module;
- a saved program: a ``torch.export`` archive (``.pt2``) or a TorchScript archive (``.pt``, ``.ts``...).

A factory in a file or module is the user's code: naming it is asking enginekit to import and run it.
A saved program looks like data but runs code from the file when loaded, so it is refused unless the
user trusts it (``--trust-checkpoint``, ``ENGINEKIT_TRUST_CHECKPOINTS=1``), as Ultralytics pickles are.
Weights files (``--weights``) are state dicts, read as data only (safetensors, or PyTorch's weights-only
unpickler).

Nothing here imports torch at module level: parsing a reference is cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from enginekit.errors import UsageError
from enginekit import reporting
from enginekit.families.base import describe_load_error
from enginekit.families.checkpoints import TRUST_ENV, TRUST_FLAG, trust_requested
from enginekit.hashing import sha256_file
from enginekit.shapes import format_shape

if TYPE_CHECKING:
    import torch

PROGRAM_SUFFIXES = {".pt2": "export", ".pt": "torchscript", ".pth": "torchscript", ".ts": "torchscript",
                    ".torchscript": "torchscript", ".jit": "torchscript"}
_FILE_FACTORY = re.compile(r"^(?P<path>.+\.py):(?P<factory>[A-Za-z_]\w*)$")
_MODULE_FACTORY = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<factory>[A-Za-z_]\w*)$")
_LIBRARY = re.compile(r"^(?P<lib>torchvision|timm):(?P<name>[A-Za-z0-9_.\-]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class Source:
    """A parsed model reference. ``kind``: torchvision | timm | file | module | export | torchscript."""

    kind: str
    text: str  # as written (a file's path made absolute)
    name: str  # the library's model name, the factory's name, or the program file's name
    path: Path | None = None  # the .py file or the program
    module: str | None = None  # package.module of a module factory

    @property
    def display(self) -> str:
        """The short name of the model (``enginekit models``, file names, reports): no folders."""
        if self.kind in ("torchvision", "timm"):
            return f"{self.kind}:{self.name}"
        if self.kind == "file":
            return f"{self.path.name}:{self.name}"
        if self.kind == "module":
            return f"{self.module}:{self.name}"
        return self.path.name

    @property
    def stem(self) -> str:
        """A file-name stem for what is exported from it (``deeplabv3_resnet50``, ``net.make``)."""
        if self.kind in ("torchvision", "timm"):
            return self.name
        if self.kind == "file":
            return f"{self.path.stem}.{self.name}"
        if self.kind == "module":
            return f"{self.module.rsplit('.', 1)[-1]}.{self.name}"
        return self.path.stem

    @property
    def framework(self) -> str:
        """The library whose version enters the keys (``pipeline.model_versions``)."""
        return self.kind if self.kind in ("torchvision", "timm") else "torch"

    @property
    def runs_code(self) -> bool:
        return self.kind in ("file", "module", "export", "torchscript")

    @property
    def is_program(self) -> bool:
        return self.kind in ("export", "torchscript")


def looks_like(text: str) -> bool:
    """Whether ``text`` names a model this family serves (cheap: no file is read)."""
    text = text.strip()
    if _LIBRARY.match(text) or _FILE_FACTORY.match(text):
        return True
    if Path(text).suffix.lower() in PROGRAM_SUFFIXES:
        return True
    return bool(_MODULE_FACTORY.match(text))


def parse(text: str) -> Source:
    """The reference ``text`` as a Source (no file is read; ``check`` does that)."""
    text = text.strip()
    m = _LIBRARY.match(text)
    if m:
        return Source(m["lib"].lower(), f"{m['lib'].lower()}:{m['name']}", m["name"])
    m = _FILE_FACTORY.match(text)
    if m:
        path = Path(m["path"]).expanduser()
        path = path if path.is_absolute() else Path.cwd() / path
        return Source("file", f"{path}:{m['factory']}", m["factory"], path)
    suffix = Path(text).suffix.lower()
    if suffix in PROGRAM_SUFFIXES:
        path = Path(text).expanduser()
        path = path if path.is_absolute() else Path.cwd() / path
        return Source(PROGRAM_SUFFIXES[suffix], str(path), path.name, path)
    m = _MODULE_FACTORY.match(text)
    if m:
        return Source("module", text, m["factory"], module=m["module"])
    raise UsageError(f"{text!r} names no model: write torchvision:NAME, timm:NAME, path/file.py:factory, "
                     "package.module:factory, or a .pt2/TorchScript program")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check(source: Source) -> None:
    """Refuse, in one line, a reference that cannot be loaded: an unknown library model, a missing file,
    a program that is not one. Reads files and imports the library, never the user's code."""
    if source.kind == "torchvision":
        import torchvision

        known = torchvision.models.list_models()
        if source.name not in known:
            import difflib

            close = difflib.get_close_matches(source.name, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UsageError(f"torchvision has no model {source.name!r}{hint}; torchvision.models.list_models() "
                             "lists them")
    elif source.kind == "timm":
        import timm

        if not timm.is_model(source.name):
            close = timm.list_models(f"*{source.name}*")[:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UsageError(f"timm has no model {source.name!r}{hint}; timm.list_models() lists them")
    elif source.kind == "module":
        import importlib.util

        top = source.module.split(".")[0]
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise UsageError(f"no module {top!r} to import {source.module}:{source.name} from "
                             "(for a file, write path/to/file.py:factory)")
    else:
        if not source.path.exists():
            # a missing file is no kind of file yet: a .pt may be a checkpoint as well as a program
            raise UsageError(f"file not found: {source.path}")
        if not source.path.is_file():
            raise UsageError(f"{source.path} is not a file")
        if source.kind == "torchscript" and not is_torchscript(source.path):
            from enginekit.families.checkpoints import describe_torch_file

            raise UsageError(
                f"{source.path.name} is {describe_torch_file(source.path)}, not a TorchScript program (torch.jit.save "
                "writes one) nor a checkpoint enginekit runs: for a state dict, name the model (torchvision:NAME, "
                "timm:NAME, file.py:factory) and pass --weights")
        if source.kind == "export" and not is_zip_with(source.path, "archive_format", "serialized_exported_program"):
            raise UsageError(f"{source.path.name} is not a torch.export program (torch.export.save writes one)")


def is_zip_with(path: Path, *names: str) -> bool:
    """Whether ``path`` is a zip archive holding a member whose name contains any of ``names``."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(any(n in member for n in names) for member in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def is_torchscript(path: Path) -> bool:
    """TorchScript archives hold their code (``code/``) and ``constants.pkl``; a state dict holds neither."""
    return is_zip_with(path, "/code/", "constants.pkl")


def identity(source: Source) -> dict[str, str]:
    """What identifies the code that builds the model, for every key that names it: the library name (its
    version is in ``pipeline.model_versions``), a file's content, a module's distribution version or file."""
    found = {"source": source.display}
    if source.kind in ("file", "export", "torchscript"):
        check(source)
        found["sha256"] = sha256_file(source.path)
    elif source.kind == "module":
        check(source)
        found.update(_module_identity(source.module))
    return found


def _module_identity(module: str) -> dict[str, str]:
    """An installed distribution's name and version; else the module file's content."""
    from importlib import metadata
    import importlib.util

    top = module.split(".")[0]
    for dist in metadata.packages_distributions().get(top, []):
        try:
            return {"distribution": dist, "version": metadata.version(dist)}
        except metadata.PackageNotFoundError:
            continue
    spec = importlib.util.find_spec(module) if "." not in module else None
    origin = getattr(spec, "origin", None) if spec else None
    if origin is None:  # a submodule: find its file without importing the package's code
        parts = module.split(".")
        top_spec = importlib.util.find_spec(parts[0])
        roots = list(top_spec.submodule_search_locations or []) if top_spec else []
        for root in roots:
            candidate = Path(root, *parts[1:]).with_suffix(".py")
            if candidate.is_file():
                origin = str(candidate)
                break
    if origin and Path(origin).is_file():
        return {"sha256": sha256_file(Path(origin))}
    return {}


# -- the user's code ---------------------------------------------------------------------------------
@contextlib.contextmanager
def user_code(what: str, *, argv0: str | None = None, capture: bool = True) -> Iterator[None]:
    """Run the user's code (importing a file, calling a factory, a forward) so that it cannot end enginekit:
    ``sys.exit`` and any exception become one ``UsageError`` naming ``what`` ("importing train.py"); with
    ``capture``, what it prints is reported as notes (stderr: stdout carries enginekit's results), and its last line is in the
    error when it fails (argparse's "error: ..."). ``sys.argv`` is ``[argv0]`` meanwhile, as ``python file.py``
    would give it: a file that parses the command line at import sees no arguments, not enginekit's.

    ``capture`` swaps the process's stdout and stderr: only for code run once on the main thread (imports,
    factories), never for a forward, which the runtime calls from several threads."""
    import io
    import sys

    saved_argv = sys.argv
    out = io.StringIO()
    try:
        if argv0 is not None:
            sys.argv = [argv0]
        with (contextlib.redirect_stdout(out) if capture else contextlib.nullcontext()), \
                (contextlib.redirect_stderr(out) if capture else contextlib.nullcontext()):
            yield
    except UsageError:
        raise
    except SystemExit as exc:
        said = _last_line(out.getvalue())
        code = exc.code if exc.code is not None else 0
        raise UsageError(f"{what} ended the program (sys.exit({code!r})){f': {said}' if said else ''}; enginekit "
                         "imports the file and calls the factory, and neither may exit (parse a command line under "
                         "`if __name__ == \"__main__\":`)") from exc
    except Exception as exc:  # noqa: BLE001 - the user's code refused: one line

        raise UsageError(describe_load_error(exc, f"{what} failed with {type(exc).__name__}")) from exc
    else:
        if out.getvalue():  # what it printed, as notes on stderr (a failure's last line is in the error instead)

            for line in out.getvalue().splitlines():
                reporting.note(f"{what}: {line}")
    finally:
        sys.argv = saved_argv


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# -- building ----------------------------------------------------------------------------------------
def build(source: Source, kwargs: dict[str, Any]) -> "torch.nn.Module":
    """The model with its builder's own weights: torchvision's and timm's untrained ones (no download), a
    factory's whatever it makes. Call under ``seed_everything``: initialisation draws from torch's RNG."""
    if source.kind == "torchvision":
        import torchvision

        builder = torchvision.models.get_model_builder(source.name)
        import inspect

        accepts = inspect.signature(builder).parameters
        args = {"weights": None, **({"weights_backbone": None} if "weights_backbone" in accepts else {})}
        args.update({k: v for k, v in kwargs.items() if k in accepts or "kwargs" in accepts})
        return _built(lambda: builder(**args), source)
    if source.kind == "timm":
        import timm

        return _built(lambda: timm.create_model(source.name, pretrained=False, **kwargs), source)
    if source.kind in ("file", "module"):
        factory = _factory(source)
        return _as_module(_built(factory, source), source)
    return load_program(source)


def _built(make, source: Source):
    with user_code(f"building {source.display}", argv0=str(source.path) if source.path else None):
        return make()


def _factory(source: Source):
    import importlib
    import importlib.util
    import sys

    where = source.display.rsplit(":", 1)[0]
    if source.kind == "file":
        check(source)
        name = f"enginekit_user_{sha256_bytes(str(source.path).encode())[:12]}"

        digest = sha256_file(source.path)
        module = sys.modules.get(name)
        if module is None or getattr(module, "__enginekit_sha256__", None) != digest:  # imported once per content
            spec = importlib.util.spec_from_file_location(name, source.path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses and pickling look their module up here
            folder = str(source.path.parent)
            added = folder not in sys.path
            if added:  # the file's siblings import as they do when it runs as a script
                sys.path.insert(0, folder)
            try:
                with user_code(f"importing {where}", argv0=str(source.path)):
                    spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            finally:
                if added:
                    sys.path.remove(folder)
            module.__enginekit_sha256__ = digest
    else:
        with user_code(f"importing {where}", argv0=source.module):
            module = importlib.import_module(source.module)
    factory = getattr(module, source.name, None)
    if factory is None or not callable(factory):
        where = source.path.name if source.kind == "file" else source.module
        raise UsageError(f"{where} has no function or class {source.name!r}")
    return factory


def _as_module(model: Any, source: Source):
    import torch

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{source.display} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def load_program(source: Source):
    """A saved program's module. Loading runs code from the file: only when trusted."""
    check(source)
    if not trust_requested():
        raise UsageError(f"{source.path.name} is a saved program: loading it runs code from the file. Pass "
                         f"{TRUST_FLAG} (or set {TRUST_ENV}=1) if you trust it")
    import torch

    logged: list = []
    try:
        if source.kind == "export":
            with _logged("torch.export", "torch._export", into=logged):  # it logs the cause, then raises
                program = torch.export.load(str(source.path))
            _refuse_static_batch(program, source)
            module = _program_module(program, source)
        else:
            module = torch.jit.load(str(source.path), map_location="cpu")
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001

        cause = next((r.exc_info[1] for r in logged if r.exc_info and r.exc_info[1] is not None), exc)
        raise UsageError(describe_load_error(cause, f"cannot load {source.path.name}")) from exc
    return module


@contextlib.contextmanager
def _logged(*loggers: str, into: list) -> Iterator[None]:
    """What ``loggers`` log meanwhile goes to ``into`` (their records), not to the terminal."""
    import logging

    class Keep(logging.Handler):
        def emit(self, record):
            into.append(record)

    keep = Keep()
    saved = [(logging.getLogger(name), logging.getLogger(name).handlers, logging.getLogger(name).propagate)
             for name in loggers]
    for logger, _, _ in saved:
        logger.handlers, logger.propagate = [keep], False  # torch gives its loggers handlers of their own
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate


def _refuse_static_batch(program, source: Source) -> None:
    """A program captured with a fixed batch (torch.export's default: every dimension static) runs at that batch
    only, and enginekit's graphs take any batch: refused in one line saying how to capture it."""
    inputs = set(program.graph_signature.user_inputs)
    shapes = [tuple(n.meta["val"].shape) for n in program.graph.nodes
              if n.op == "placeholder" and n.name in inputs and hasattr(n.meta.get("val"), "shape")]
    if len(shapes) == 1 and len(shapes[0]) == 4 and isinstance(shapes[0][0], int):
        shape = tuple(d if isinstance(d, int) else "?" for d in shapes[0])
        raise UsageError(f"{source.path.name} was captured with a fixed input {format_shape(shape)} (torch.export's "
                         "default: static shapes), and enginekit's graphs take any batch: capture it with "
                         "dynamic_shapes=({0: torch.export.Dim('batch')},) (add 2 and 3 for any H x W)")


def _program_module(program, source: Source):
    """A torch.export program's module, run as it was captured. ``ExportedProgram.module()`` refuses
    ``train()``/``eval()`` (the graph is fixed: a mode switch would change nothing), which every module
    enginekit wraps goes through: the module gets ``nn.Module``'s own back, setting the flag only. A program
    captured in training mode (dropout, batch statistics) is refused: what it computes is not inference."""
    import torch

    module = program.module()
    for name in ("train", "eval"):
        module.__dict__.pop(name, None)
    training = sorted({str(n.target) for n in module.graph.nodes if n.op == "call_function" and (
        "dropout" in str(n.target) or "_native_batch_norm_legit_functional" in str(n.target)
        or ("batch_norm" in str(n.target) and "no_training" not in str(n.target) and _training_arg(n)))})
    if training:
        raise UsageError(f"{source.path.name} was captured in training mode ({training[0]}): export the model "
                         "after model.eval() (torch.export.export(model.eval(), ...))")
    return module.eval() if isinstance(module, torch.nn.Module) else module


def _training_arg(node) -> bool:
    """Whether a batch_norm call of an exported graph normalises by the batch (its ``training`` argument)."""
    training = node.kwargs.get("training")
    if training is None and len(node.args) > 5:
        training = node.args[5]
    return bool(training) if isinstance(training, bool) else False


# -- weights -------------------------------------------------------------------------------------------
def read_state_dict(path: Path) -> dict:
    """A state dict from safetensors or a PyTorch file, read as data only (no code from the file runs)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            import torch

            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001
        from enginekit.families.checkpoints import state_dict_refusal

        raise state_dict_refusal(path, "a state dict (safetensors, or a torch.save of model.state_dict())",
                                 exc) from exc
    for key in ("state_dict", "model_state_dict", "model", "module"):  # trainers nest it under one of these
        if isinstance(state, dict) and isinstance(state.get(key), dict) and _tensors(state[key]):
            state = state[key]
            break
    if not isinstance(state, dict) or not _tensors(state):
        raise UsageError(f"{path} holds a {type(state).__name__} with no tensors, not a state dict")
    if all(k.startswith("module.") for k in state):  # saved from DataParallel / DistributedDataParallel
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def _tensors(state: dict) -> bool:
    import torch

    return bool(state) and all(isinstance(v, torch.Tensor) for v in state.values())


def load_weights(module, path: Path, what: str) -> None:
    """Put the state dict at ``path`` into ``module``; every key must match, in name and shape."""
    state = read_state_dict(path)
    target = module.state_dict()
    missing = sorted(set(target) - set(state))
    unexpected = sorted(set(state) - set(target))
    if missing or unexpected:
        first = (missing or unexpected)[0]
        raise UsageError(f"{path.name} does not match {what}: {len(missing)} missing, {len(unexpected)} unexpected "
                         f"keys (first {'missing' if missing else 'unexpected'}: {first})")
    bad = [k for k in target if tuple(target[k].shape) != tuple(state[k].shape)]
    if bad:
        raise UsageError(f"{path.name} does not match {what}: {bad[0]} has shape {tuple(state[bad[0]].shape)}, "
                         f"the model's is {tuple(target[bad[0]].shape)}")
    module.load_state_dict(state, strict=True)


def state_digest(module) -> str:
    """One sha256 over a module's state dict (names, dtypes, shapes, bytes)."""
    import torch

    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def published_weights(source: Source) -> Path:
    """The local file of a library model's published weights (downloaded if need be)."""
    if source.kind == "torchvision":
        import torchvision

        try:
            weights = torchvision.models.get_model_weights(source.name).DEFAULT
        except (ValueError, KeyError) as cause:
            raise UsageError(f"torchvision publishes no weights for {source.name}: pass --weights PATH or "
                             "--random-init") from cause
        import torch

        target = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
        if not target.is_file():
            try:
                torch.hub.download_url_to_file(weights.url, str(target), progress=False)
            except Exception as cause:  # noqa: BLE001
                raise UsageError(f"cannot download {source.name}'s weights {weights} (offline?): pass --weights PATH "
                                 "(a state dict), or --random-init for structure-only work") from cause
        return target
    if source.kind == "timm":
        import timm

        cfg = timm.models.get_pretrained_cfg(source.name) if hasattr(timm.models, "get_pretrained_cfg") else None
        hub = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
        if not hub:
            raise UsageError(f"timm publishes no weights for {source.name} on the Hugging Face hub: pass --weights "
                             "PATH or --random-init")
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        for filename in ("model.safetensors", "pytorch_model.bin"):
            cached = try_to_load_from_cache(hub, filename)
            if isinstance(cached, str):
                return Path(cached)
        try:
            return Path(hf_hub_download(hub, "model.safetensors"))
        except Exception as cause:  # noqa: BLE001
            raise UsageError(f"cannot download {hub} (offline?): pass --weights PATH (a state dict), or "
                             "--random-init for structure-only work") from cause
    raise UsageError(f"{source.display} has no published weights")
