"""``load(target, ...)``: a model name, cache key, recipe, engine plan or ONNX file -> a Predictor."""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from enginekit.errors import CapabilityError, UsageError
from enginekit.runtime.backends import BACKENDS

PRECISIONS = ("fp32", "fp16", "int8", "fp8")


@dataclass
class Target:
    """What ``load`` was given, resolved: a model (to export/build), an ONNX file, or an engine."""

    kind: str  # "model" | "onnx" | "engine"
    label: str
    model: str | None = None  # model name (for "model"; and what an ONNX/engine says it is)
    path: Path | None = None
    manifest: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    weights: Path | None = None
    random_init: bool = False
    seed: int = 0
    precision: str | None = None


def _onnx_metadata(path: Path) -> dict:
    import onnx

    from enginekit.onnx.graph import get_metadata

    try:
        return get_metadata(onnx.load(str(path), load_external_data=False))
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"{path} is not a readable ONNX model: {str(exc).splitlines()[0][:160]}") from None


def _engine_target(plan: Path, manifest: dict, label: str, cache) -> Target:
    """An engine plan and what its manifest says (model, weights, and the ONNX it came from)."""
    request = manifest.get("model_request") or {}
    metadata: dict = {}
    for link in reversed(manifest.get("chain", [])):  # the graph the engine was built from names the model
        if "kind" in link and cache is not None:
            found = cache.lookup(link["kind"], link["key"], verify=False)
            if found.entry is not None:
                metadata = _onnx_metadata(found.entry.file("model.onnx"))
                break
    model = request.get("name") or metadata.get("model")
    precision = (manifest.get("precision") or {}).get("mode")
    return Target("engine", label, model, plan, manifest, metadata, precision=precision)


def resolve_target(target, *, weights=None, random_init=False, seed=0, cache=None) -> Target:
    """Tell what ``target`` is without loading anything heavy."""
    text = str(target)
    path = Path(text)
    if path.suffix == ".onnx" or (path.is_file() and path.suffix not in (".plan", ".engine", ".yaml", ".yml")):
        if not path.is_file():
            raise UsageError(f"ONNX file not found: {path}")
        meta = _onnx_metadata(path)
        return Target("onnx", path.name, meta.get("model"), path, metadata=meta, precision=meta.get("precision"))
    if path.suffix in (".plan", ".engine"):
        if not path.is_file():
            raise UsageError(f"engine plan not found: {path}")
        side = path.with_name("manifest.json")
        if not side.is_file():
            raise UsageError(f"{path} has no manifest.json beside it: load it by its cache key, or from its cache folder")
        return _engine_target(path, json.loads(side.read_text()), path.name, cache)
    if path.suffix in (".yaml", ".yml"):
        from enginekit.recipes import load_recipe

        recipe = load_recipe(text)
        spec = recipe.model
        w = (recipe.path.parent / spec.weights) if spec.weights else None
        return Target("model", recipe.name, spec.variant, weights=w, random_init=spec.random_init, seed=spec.seed,
                      precision=recipe.precisions[0] if recipe.precisions else None)
    from enginekit.families import resolve

    try:
        resolve(text)
        return Target("model", text, text, weights=Path(weights) if weights else None, random_init=random_init,
                      seed=seed)
    except UsageError:
        if not re.fullmatch(r"[0-9a-f]{6,64}", text.lower()):
            raise
    from enginekit.cache import Cache

    cache = cache or Cache()
    entry = cache.resolve(text)
    if entry.kind == "engine":
        return _engine_target(entry.file("engine.plan"), entry.manifest, f"engine {entry.key[:12]}", cache)
    onnx_file = entry.file("model.onnx")
    if not onnx_file.is_file():
        raise UsageError(f"cache entry {entry.key[:12]} is a {entry.kind}, neither an engine nor an ONNX graph")
    meta = _onnx_metadata(onnx_file)
    return Target("onnx", f"{entry.kind} {entry.key[:12]}", meta.get("model"), onnx_file, entry.manifest, meta,
                  precision=meta.get("precision"))


# -- backend choice ---------------------------------------------------------------------------------
def _gpu():
    from enginekit.gpu import gpu_info

    return gpu_info()


def _tensorrt_runs_here() -> tuple[bool, str]:
    from enginekit.trt.backends import TRAITS, resolve_backend

    gpu = _gpu()
    if gpu is None:
        return False, "no GPU"
    reasons = []
    for family in ("tensorrt", "tensorrt-rtx"):
        try:
            be = resolve_backend(family)
        except Exception:  # noqa: BLE001
            reasons.append(f"{family} is not installed")
            continue
        if be.traits.supports_compute_capability_targets:
            from enginekit.trt.backends import RTX_COMPUTE_CAPABILITIES

            if gpu.compute_capability not in RTX_COMPUTE_CAPABILITIES:
                reasons.append(f"{be.label} does not run on compute capability {gpu.compute_capability} ({gpu.name})")
                continue
        return True, f"{be.label} runs on {gpu}"
    del TRAITS
    return False, "; ".join(reasons)


def _cuda_provider_loads() -> tuple[bool, str]:
    try:
        from enginekit.runtime.providers import require_cuda_provider

        require_cuda_provider()
        return True, "ONNX Runtime's CUDA provider loads"
    except CapabilityError as exc:
        return False, str(exc)


def _torch_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def choose_backend(target: Target, requested: str, device: str | None) -> tuple[str, str]:
    """(backend, reason). ``auto``: TensorRT where it runs, else ONNX Runtime CUDA, else PyTorch on the
    GPU, else ONNX Runtime on the CPU (PyTorch on the CPU for a model ONNX Runtime cannot take)."""
    if requested not in BACKENDS:
        raise UsageError(f"unknown backend {requested!r}: choose one of {', '.join(BACKENDS)}")
    if target.kind == "engine":
        if requested not in ("auto", "tensorrt"):
            raise UsageError(f"{target.label} is a TensorRT engine: it runs on the tensorrt backend only")
        return "tensorrt", "an engine plan runs on TensorRT"
    if requested == "torch" and target.kind != "model":
        if not target.model or not (target.metadata.get("weights", "").startswith("random:")):
            raise UsageError(f"{target.label} is an ONNX file: the torch backend needs a model name (and --weights)")
    if requested != "auto":
        return requested, "asked for"
    cpu_only = device is not None and device.startswith("cpu")
    notes = []
    if not cpu_only and _gpu() is not None:
        if target.kind == "model":
            ok, why = _tensorrt_runs_here()
            if ok:
                return "tensorrt", why
            notes.append(f"TensorRT: {why}")
        ok, why = _cuda_provider_loads()
        if ok:
            return "onnxruntime-cuda", "; ".join(notes + [why])
        notes.append(why)
        if target.kind == "model" and _torch_cuda():
            return "torch", "; ".join(notes + ["PyTorch on the GPU"])
    elif not cpu_only:
        notes.append("no GPU")
    return "onnxruntime-cpu", "; ".join(notes + ["ONNX Runtime on the CPU"])


# -- building what the backend runs ---------------------------------------------------------------------
def _simplifier() -> str:
    import importlib.util

    return "onnxsim" if importlib.util.find_spec("onnxsim") else "onnxslim"


def _export_onnx(target: Target, precision: str, cache, quiet: bool) -> Path:
    from enginekit.flows import run
    from enginekit.flows.export import run_export
    from enginekit.requests import ExportRequest

    if precision not in ("fp32", "fp16"):
        raise UsageError(f"ONNX Runtime runs fp32 and fp16 graphs of a model name; {precision} needs the tensorrt "
                         "backend (or load the ONNX file `enginekit build` wrote)")
    with tempfile.TemporaryDirectory() as tmp:
        request = ExportRequest(model=target.model, fp16=precision == "fp16", output=Path(tmp) / "model.onnx",
                                weights=target.weights, random_init=target.random_init, seed=target.seed,
                                simplifier=_simplifier())
        result = run(run_export, request, cache, quiet=quiet)
    if not result.passed:
        from enginekit.errors import ParityError

        raise ParityError(f"{target.model} {precision} failed its parity gate: " + "; ".join(result.failures()))
    return result.artifacts[-1].path


def _torch_module(target: Target):
    from enginekit.families import resolve

    adapter = resolve(target.model)
    weights = target.weights
    random_init = target.random_init
    seed = target.seed
    ident = target.metadata.get("weights", "")
    if target.kind == "onnx" and ident.startswith("random:"):  # rebuild the same seeded weights
        random_init, seed = True, int(ident.rsplit("@", 1)[-1])
    loaded = adapter.load(weights, random_init=random_init, seed=seed)
    meta = dict(loaded.metadata)
    return adapter, loaded.module, meta


def load(target, precision: str = "fp32", backend: str = "auto", *, weights=None, random_init: bool = False,
         seed: int = 0, device: str | None = None, conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
         input_size=None, cuda_graph: bool | None = None, fuse_attention: bool | None = None, cache=None,
         quiet: bool = True, **build_options):
    """A predictor over ``target``: ``predictor(images)`` -> results in the original image's pixels.

    ``target``: a model name (exported or built through the cache as needed, with ``weights`` or
    ``random_init``), a cache key, a recipe, an engine plan (with its manifest.json) or an ONNX file.
    ``backend``: auto | tensorrt | onnxruntime-cuda | onnxruntime-cpu | torch; ``predictor.backend``
    and ``predictor.reason`` say what was chosen and why.
    ``fuse_attention`` (onnxruntime-cuda): run a copy of the graph with ONNX Runtime's fused attention
    (``enginekit.onnx.attention``); None: where the family declares its attention fusable.
    """
    from enginekit.families import resolve
    from enginekit.runtime.predictor import Predictor, processor_for

    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}: choose {', '.join(PRECISIONS)}")
    if device is not None and not re.fullmatch(r"cpu|cuda(:[0-9]{1,3})?", device):
        raise UsageError(f"--device {device!r}: expected cpu, cuda or cuda:N")
    for flag, value in (("--conf", conf), ("--iou", iou)):
        if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):  # NaN fails this too
            raise UsageError(f"{flag} {value}: expected a number from 0 to 1")
    if weights is not None and random_init:
        raise UsageError("--weights and --random-init exclude each other")
    t = resolve_target(target, weights=weights, random_init=random_init, seed=seed, cache=cache)
    name, reason = choose_backend(t, backend, device)
    if t.kind != "model" and t.precision and precision != "fp32" and precision != t.precision:
        raise UsageError(f"{t.label} is a {t.precision} graph; drop --precision or ask for {t.precision}")
    prec = t.precision if t.kind != "model" and t.precision else precision
    gpu_backend = name in ("tensorrt", "onnxruntime-cuda") or (name == "torch" and not (device or "").startswith("cpu")
                                                                 and _gpu() is not None and _torch_cuda())
    dev = device or ("cuda:0" if gpu_backend else "cpu")
    if name in ("tensorrt", "onnxruntime-cuda") and dev.startswith("cpu"):
        raise UsageError(f"the {name} backend runs on a GPU, not on {dev}")
    if not t.model and name != "onnxruntime-cpu":
        raise UsageError(f"{t.label} does not say which model it is (no enginekit metadata)")
    if not t.model:
        raise UsageError(f"{t.label} does not say which model it is: enginekit runs the graphs it wrote")
    adapter = resolve(t.model)
    processor_cls = processor_for(adapter)  # a family the runtime does not run is refused before any export
    metadata = dict(t.metadata)

    if name == "torch":
        if prec not in ("fp32", "fp16"):
            raise UsageError(f"the torch backend runs fp32 and fp16 (FP16 on a GPU), not {prec}")
        adapter, module, meta = _torch_module(t)
        metadata.update(meta)
        from enginekit.runtime.backends import TorchSession

        session = TorchSession(module, adapter.output_names, adapter.input_name,
                               (None, 3, None, None) if 2 in adapter.dynamic_axes.get(adapter.input_name, {})
                               else (None, *adapter.default_input[1:]),
                               dev, half=prec == "fp16", cuda_graph=cuda_graph)
        source = f"PyTorch module ({t.label})"
    elif name in ("onnxruntime-cpu", "onnxruntime-cuda"):
        path = t.path if t.kind == "onnx" else _export_onnx(t, prec, cache, quiet)
        if not metadata:
            metadata = _onnx_metadata(path)
        if name == "onnxruntime-cpu":
            from enginekit.runtime.backends import OrtCpuSession

            session = OrtCpuSession(path)
        else:
            from enginekit.runtime.backends import OrtCudaSession

            fuse = adapter.fusable_attention if fuse_attention is None else fuse_attention
            session = OrtCudaSession(path, dev, cuda_graph=cuda_graph, fuse_attention=fuse, cache=cache)
        source = str(path)
    else:  # tensorrt
        if t.kind == "model":
            from enginekit.flows import run
            from enginekit.flows.build import run_build
            from enginekit.requests import BuildRequest

            opts = {k: v for k, v in build_options.items() if v is not None}
            request = BuildRequest(target=t.model, precision=prec, weights=t.weights, random_init=t.random_init,
                                   seed=t.seed, **opts)
            outcome = run(run_build, request, cache, quiet=quiet)
            from enginekit.cache import Cache

            t = _engine_target(outcome.engine, outcome.manifest, f"engine {outcome.entry.key[:12]}", cache or Cache())
            metadata = {**metadata, **t.metadata}
        elif t.kind == "onnx":
            raise UsageError(f"build an engine from {t.label} first (enginekit build {t.path}), then load the engine")
        from enginekit.runtime.backends import TensorRTSession

        session = TensorRTSession(t.path, t.manifest, adapter.input_name, dev)
        source = str(t.path)
    if "names" not in metadata and (names := adapter.default_class_names()):  # a graph that names no classes
        metadata["names"] = str(names)
    processor = processor_cls(adapter, metadata, session.info, conf=conf, iou=iou, max_det=max_det,
                              input_size=input_size)
    return Predictor(session, processor, model=adapter.variant, family=adapter.family, reason=reason,
                     precision=prec or "fp32", source=source)
