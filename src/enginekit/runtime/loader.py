"""``load(target, ...)``: an ONNX file, engine plan, cache key, or a model's weights -> a Predictor.

The runtime only loads: what ``target`` names must exist (an ONNX graph or engine plan, in the cache
or beside it; a model's PyTorch weights for the torch backend). ``plan_load`` resolves the target
and chooses its backend; ``open_plan`` loads it. A model name on a backend that runs graphs or
engines is made by the API layer (``enginekit.load``: ``enginekit.flows.load`` exports or builds
it, then comes back here with the artifact).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from enginekit import backends
from enginekit.backends.base import ENGINE, KIND_WORDS, MODULE, ONNX, Artifact
from enginekit.errors import CapabilityError, UsageError
from enginekit.model import ModelRequest, check_weights_choice
from enginekit.precisions import NAMES as PRECISIONS
from enginekit.gpu import check_device
from enginekit.backends.base import SessionInfo
from enginekit.cache import Cache
from enginekit.engine_file import read_header
from enginekit.families.registry import graph_metadata, model_of_metadata, recorded_declaration, resolve, resolve_recorded
from enginekit.families.torch_models.sources import PROGRAM_SUFFIXES
from enginekit.fsutil import read_text
from enginekit.gpu import gpu_info
from enginekit.manifest import MANIFEST_LIMIT
from enginekit.onnx.graph import get_metadata
from enginekit.recipes import load_recipe
from enginekit.runtime.predictor import Predictor, processor_for
from enginekit.trt.flavours import plan_family, resolve_flavour
from enginekit.verification.record import engine_record, record_of
from enginekit import reporting



@dataclass
class Target:
    """What ``load`` was given, resolved: a model (to export/build), an ONNX file, or an engine."""

    kind: str  # "model" | ONNX | ENGINE
    label: str
    model: str | None = None  # model name (for "model"; and what an ONNX/engine says it is)
    path: Path | None = None
    manifest: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    request: ModelRequest | None = None  # a model's: which weights
    precision: str | None = None

    weights = property(lambda self: self.request.weights if self.request else None)
    random_init = property(lambda self: bool(self.request and self.request.random_init))
    seed = property(lambda self: self.request.seed if self.request else 0)


def _onnx_metadata(path: Path) -> dict:
    import onnx

    try:
        meta = get_metadata(onnx.load(str(path), load_external_data=False))
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"{path} is not a readable ONNX model: {str(exc).splitlines()[0][:160]}") from exc
    try:
        return graph_metadata(meta)  # a file Ultralytics exported reads as the model it records
    except UsageError as exc:
        raise UsageError(f"{path.name}: {exc}") from exc


def ultralytics_engine_target(path: Path) -> Target | None:
    """An engine file as Ultralytics writes it (its JSON header, then the plan: ``engine_file``) as a Target; None
    where the file is a bare plan. Its manifest is made from the header: the model, its input size and batch, and
    the TensorRT installed here (Ultralytics records no version: TensorRT's own check of the plan decides)."""
    offset, header = read_header(path)
    if header is None:
        return None
    try:
        meta = graph_metadata(header)
    except UsageError as exc:
        raise UsageError(f"{path.name}: {exc}") from exc
    if not meta.get("model"):
        raise UsageError(f"{path.name}: its header does not say which model it is")

    with open(path, "rb") as f:
        f.seek(offset)
        flavour = plan_family(f.read(4))

    try:
        installed = resolve_flavour(flavour)
        version, name = installed.version, installed.name
    except (UsageError, CapabilityError):
        version, name = "not installed", flavour
    h, w = (int(v) for v in meta["export_shape"].split("x")[2:4])
    batch = int(header.get("batch") or 1)
    profile = {"min": [1, 3, h, w], "opt": [1, 3, h, w], "max": [batch, 3, h, w]}

    gpu = gpu_info()
    manifest = {"backend": name, "backend_version": version, "gpu": gpu.to_json() if gpu else None,
                "profiles": [{"images": profile}], "header_bytes": offset, "ultralytics_header": header,
                "precision": {"mode": meta.get("precision", "fp32")}}
    return Target(ENGINE, path.name, meta["model"], path, manifest, meta, precision=meta.get("precision"))


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
    return Target(ENGINE, label, model, plan, manifest, metadata, precision=precision)


def resolve_target(target, *, weights=None, random_init=False, seed=0, cache=None, declared=None) -> Target:
    """Tell what ``target`` is without loading anything heavy."""
    text = str(target)
    path = Path(text)
    models = (".plan", ".engine", ".yaml", ".yml", *PROGRAM_SUFFIXES)  # checkpoints and programs name models
    if path.suffix == ".onnx" or (path.is_file() and path.suffix.lower() not in models):
        if not path.is_file():
            raise UsageError(f"ONNX file not found: {path}")
        meta = _onnx_metadata(path)
        return Target(ONNX, path.name, meta.get("model"), path, metadata=meta, precision=meta.get("precision"))
    if path.suffix in (".plan", ".engine"):
        if not path.is_file():
            raise UsageError(f"engine plan not found: {path}")
        side = path.with_name("manifest.json")
        if not side.is_file() and not os.path.lexists(side):
            target = ultralytics_engine_target(path)
            if target is None:
                raise UsageError(f"{path} has no manifest.json beside it and no Ultralytics header: load it by its cache "
                                 "key, or from its cache folder")
            return target

        try:
            manifest = json.loads(read_text(side, limit=MANIFEST_LIMIT, what="engine manifest"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{side} is not a readable engine manifest: {str(exc).splitlines()[0][:160]}") from exc
        if not isinstance(manifest, dict):
            raise UsageError(f"{side} is not an engine manifest (a JSON object)")
        return _engine_target(path, manifest, path.name, cache)
    if path.suffix in (".yaml", ".yml"):
        recipe = load_recipe(text)
        return Target("model", recipe.name, recipe.variant, request=recipe.model_request(),
                      precision=recipe.precisions[0] if recipe.precisions else None)
    try:
        request = ModelRequest(text, weights, random_init, seed, declared=declared or {})
        return Target("model", text, request.name, request=request)  # best.pt: the model it records
    except UsageError:
        if not re.fullmatch(r"[0-9a-f]{6,64}", text.lower()):
            raise

    cache = cache or Cache()
    entry = cache.resolve(text)
    if entry.kind == "engine":
        return _engine_target(entry.file("engine.plan"), entry.manifest, f"engine {entry.key[:12]}", cache)
    onnx_file = entry.file("model.onnx")
    if not onnx_file.is_file():
        raise UsageError(f"cache entry {entry.key[:12]} is a {entry.kind}, neither an engine nor an ONNX graph")
    meta = _onnx_metadata(onnx_file)
    return Target(ONNX, f"{entry.kind} {entry.key[:12]}", meta.get("model"), onnx_file, entry.manifest, meta,
                  precision=meta.get("precision"))


# -- backend choice ---------------------------------------------------------------------------------
def choose_backend(target: Target, requested: str, device: str | None) -> tuple[type[backends.Backend], str]:
    """(backend, reason). ``auto``: the registry's backends by rank (TensorRT where it runs, else ONNX
    Runtime CUDA, else PyTorch on the GPU, else ONNX Runtime on the CPU), each where it can run
    what ``target`` is or becomes; the reason says what was passed over and why."""
    chosen = backends.get(requested) if requested != backends.AUTO else None
    if target.kind == ENGINE:
        runners = backends.running(ENGINE)
        if chosen is not None and chosen not in runners:
            only = " or ".join(b.name for b in runners)
            raise UsageError(f"{target.label} is a TensorRT engine: it runs on the {only} backend only")
        chosen = chosen or runners[0]
        return chosen, f"an engine plan runs on {chosen.label}"
    if chosen is not None:
        refused = chosen.refuses(target)
        if refused:
            raise UsageError(refused)
        if target.kind == "model" and MODULE not in chosen.runs:
            # a model name becomes the backend's artifact first (an export, a build): whether the backend runs here
            # is known before that work, not after it
            verdict = chosen.check(device=chosen.default_device(device))
            if not verdict.ok:
                raise CapabilityError(f"the {chosen.name} backend cannot run here ({verdict.reason}): nothing was "
                                      f"exported or built for {target.label}")
        return chosen, "asked for"
    cpu_only = device is not None and device.startswith("cpu")
    gpu = None if cpu_only else _gpu()
    notes: list[str] = []
    for candidate in backends.auto_order():
        if target.kind != "model" and target.kind not in candidate.runs:
            continue
        if candidate.runs_on != "cpu":
            if cpu_only:
                continue
            if gpu is None:
                if "no GPU" not in notes:
                    notes.append("no GPU")
                continue
            verdict = candidate.check(device="cuda:0", gpu=gpu)
        else:
            verdict = candidate.check(device="cpu", gpu=gpu)
        if verdict.ok:
            return candidate, "; ".join(notes + [verdict.reason])
        notes.append(f"{candidate.label}: {verdict.reason}")
    raise CapabilityError(f"no backend can run {target.label} here: " + "; ".join(notes))


def _gpu():
    return gpu_info()


# -- what to load ------------------------------------------------------------------------------------
@dataclass
class LoadPlan:
    """A resolved target on its chosen backend: what ``open_plan`` loads (and, for a model name on a
    backend that runs graphs or engines, what must be made first: ``missing``)."""

    target: Target
    backend: type[backends.Backend]
    reason: str
    precision: str
    device: str
    adapter: Any

    @property
    def missing(self) -> str | None:
        """ONNX or ENGINE: the artifact a model name needs made before this backend loads it; None: it exists."""
        if self.target.kind != "model" or MODULE in self.backend.runs:
            return None
        return self.backend.runs[0]

    def with_onnx(self, path: Path) -> "LoadPlan":
        """This plan over ``path``, the graph made for it (what its metadata says the model is)."""
        meta = _onnx_metadata(path)
        t = self.target
        graph = Target(ONNX, path.name, t.model, path, metadata=meta, request=t.request,
                       precision=meta.get("precision"))
        return replace(self, target=graph)

    def with_engine(self, plan: Path, manifest: dict, label: str, cache) -> "LoadPlan":
        """This plan over an engine built for it."""
        return replace(self, target=_engine_target(plan, manifest, label, cache))


def plan_load(target, precision: str = "fp32", backend: str = "auto", *, weights=None, random_init: bool = False,
              seed: int = 0, device: str | None = None, conf: float = 0.25, iou: float = 0.7, cache=None,
              declared: dict | None = None) -> LoadPlan:
    """Check the arguments, resolve ``target`` and choose its backend; nothing heavy is loaded. ``declared``:
    what the user declares of a model name (``--task``, ``--outputs``...; a graph or engine records its own)."""
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}: choose {', '.join(PRECISIONS)}")
    check_device(device)
    for flag, value in (("--conf", conf), ("--iou", iou)):
        if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):  # NaN fails this too
            raise UsageError(f"{flag} {value}: expected a number from 0 to 1")
    check_weights_choice(weights, random_init)
    t = resolve_target(target, weights=weights, random_init=random_init, seed=seed, cache=cache, declared=declared)
    if declared and t.kind != "model":
        raise UsageError(f"{t.label} records what its outputs are and how its inputs are made: drop the model "
                         "declarations (--task, --outputs, ...)")
    chosen, reason = choose_backend(t, backend, device)
    if t.kind != "model" and t.precision and precision != "fp32" and precision != t.precision:
        raise UsageError(f"{t.label} is a {t.precision} graph; drop --precision or ask for {t.precision}")
    prec = t.precision if t.kind != "model" and t.precision else precision
    dev = chosen.default_device(device)
    if chosen.runs_on == "gpu" and dev.startswith("cpu"):
        raise UsageError(f"the {chosen.name} backend runs on a GPU, not on {dev}")
    if chosen.runs_on == "cpu" and dev.startswith("cuda"):
        raise UsageError(f"the {chosen.name} backend runs on the CPU, not on {dev}")
    if not t.model:
        raise UsageError(f"{t.label} does not say which model it is: enginekit runs the graphs it wrote")
    adapter = target_adapter(t)
    processor_for(adapter)  # a family the runtime does not run is refused before any export
    check_output_ranks(t, adapter)
    failed = failed_check(t, cache)
    if failed:  # its record holds a failed check: it runs, marked so wherever its predictor says what it is
        reporting.warning(f"{t.label} failed a check ({failed}): its results are not what its PyTorch model gives")
        reason = f"FAILED CHECK: {failed}; {reason}"
    if MODULE in chosen.runs and chosen.precisions and prec not in chosen.precisions:
        raise UsageError(f"the {chosen.name} backend runs {' and '.join(chosen.precisions)} (FP16 on a GPU), "
                         f"not {prec}")
    return LoadPlan(t, chosen, reason, prec, dev, adapter)


def open_plan(p: LoadPlan, *, conf: float = 0.25, iou: float = 0.7, max_det: int = 300, input_size=None,
              cuda_graph: bool | None = None, fuse_attention: bool | None = None, cache=None,
              gpu_letterbox: bool = False):
    """Load what ``p`` names on its backend: a Predictor. The artifact must exist (``p.missing`` is None).
    ``gpu_letterbox``: resize frames on the GPU rather than letterbox them with OpenCV on the host as
    ``YOLO(pt).predict`` does (a frame stays on the device; pixels up to a grey level from the .pt's)."""
    t, chosen, adapter = p.target, p.backend, p.adapter
    processor_cls = processor_for(adapter)
    metadata = dict(t.metadata)
    if MODULE in chosen.runs:
        adapter, module, meta = _torch_module(t)
        metadata.update(meta)
        dynamic_hw = 2 in adapter.dynamic_axes.get(adapter.input_name, {})
        shape = (None, 3, None, None) if dynamic_hw else (None, *adapter.default_input[1:])
        artifact = Artifact.of_module(module, adapter.input_name, adapter.output_names, shape)
        source = f"PyTorch module ({t.label})"
    elif t.kind in chosen.runs:
        if t.kind == ENGINE:
            artifact = Artifact.engine(t.path, t.manifest, adapter.input_name)
        else:
            artifact = Artifact(t.kind, t.path, t.manifest, input_name=adapter.input_name)
        source = str(t.path)
    elif t.kind == "model":
        raise UsageError(f"{t.label} is a model name, and the {chosen.name} backend runs {KIND_WORDS[p.missing]}: "
                         "enginekit.load exports or builds it (enginekit.runtime.load only loads what exists)")
    else:
        raise UsageError(chosen.refuses(t) or f"the {chosen.name} backend cannot run {t.label}")
    fuse = adapter.fusable_attention if fuse_attention is None else fuse_attention
    # frames letterboxed to their rectangle come in a few shapes (one per aspect ratio): a graph of dynamic
    # H/W is worth capturing per shape, as one of fixed H/W is (ONNX Runtime CUDA)
    per_shape = bool(getattr(processor_cls, "rect", False))
    session = chosen(artifact, device=p.device, precision=p.precision, cuda_graph=cuda_graph, fuse_attention=fuse,
                     cache=cache, graph_per_shape=per_shape)
    session.activate()
    if "names" not in metadata and (names := adapter.default_class_names()):  # a graph that names no classes
        metadata["names"] = str(names)
    processor = processor_cls(adapter, metadata, session.info, conf=conf, iou=iou, max_det=max_det,
                              input_size=input_size, gpu_letterbox=gpu_letterbox)
    note = getattr(processor, "input_note", "")
    return Predictor(session, processor, model=adapter.variant, family=adapter.family,
                     reason=f"{p.reason}; {note}" if note else p.reason, precision=p.precision or "fp32", source=source)


def failed_check(t: Target, cache) -> str:
    """The failed check the record of ``t``'s graph or engine holds (``verification.record``), "" where none: a graph
    by its content wherever it lies, an engine by its source graph and its own build."""
    if t.kind == ONNX and t.path is not None:
        from enginekit.hashing import sha256_file

        return record_of(cache or Cache(), sha256_file(t.path)).failure_line()
    if t.kind == ENGINE and t.manifest.get("chain"):
        return engine_record(cache or Cache(), t.manifest).failure_line()
    return ""


def output_ranks(t: Target) -> dict[str, int]:
    """The rank of each output of ``t``'s graph or engine, where it records one ({} for a model name)."""
    if t.kind == ONNX and t.path is not None:
        import onnx

        try:
            graph = onnx.load(str(t.path), load_external_data=False).graph
        except Exception:  # noqa: BLE001 - read already (its metadata); a session says what is wrong with it
            return {}
        return {o.name: len(o.type.tensor_type.shape.dim) for o in graph.output
                if o.type.tensor_type.HasField("shape")}
    if t.kind == ENGINE:
        return {io["name"]: len(io.get("shape") or ()) for io in t.manifest.get("io") or ()
                if isinstance(io, dict) and io.get("mode") == "output" and io.get("shape") is not None}
    return {}


def check_output_ranks(t: Target, adapter) -> None:
    """A graph or engine whose outputs are not what its recorded task gives (a classifier whose metadata says
    ``detect``): one line when it is loaded, naming the output, not an IndexError at its first frame."""
    expected = getattr(adapter, "output_ranks", None) or {}
    ranks = output_ranks(t)
    if not expected or not ranks:
        return
    task = getattr(adapter, "task", "?")
    for name, rank in expected.items():
        if name not in ranks:
            raise UsageError(f"{t.label}: its metadata says it is a {task} model, which gives {name}, but its outputs "
                             f"are {', '.join(ranks)}: its metadata does not describe this graph")
        if ranks[name] != rank:
            raise UsageError(f"{t.label}: its metadata says it is a {task} model, whose {name} has {rank} dimensions, "
                             f"but this one's has {ranks[name]}: its metadata does not describe this graph (a "
                             f"{'classify' if ranks[name] == 2 else 'other'} model's output?)")


def target_adapter(t: Target):
    """The adapter of what ``t`` names: its request's, else the model its graph or engine records, with the
    declaration recorded beside it (the graph's metadata, else the engine's build request)."""
    if t.request is not None:
        return t.request.adapter
    found = model_of_metadata(t.metadata)  # a checkpoint's export, a file Ultralytics wrote: what it is, no name
    if found is not None:
        return found
    declared = recorded_declaration(t.metadata) or (t.manifest.get("model_request") or {}).get("declared") or {}
    return resolve(t.model, declared)


def _torch_module(target: Target):
    adapter = target_adapter(target)
    weights = target.weights
    random_init = target.random_init
    seed = target.seed
    ident = target.metadata.get("weights", "")
    if target.kind == ONNX and ident.startswith("random:"):  # rebuild the same seeded weights
        random_init, seed = True, int(ident.rsplit("@", 1)[-1])
    loaded = adapter.load(weights, random_init=random_init, seed=seed)
    meta = dict(loaded.metadata)
    return adapter, loaded.module, meta


def load(target, precision: str = "fp32", backend: str = "auto", *, weights=None, random_init: bool = False,
         seed: int = 0, device: str | None = None, conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
         input_size=None, cuda_graph: bool | None = None, fuse_attention: bool | None = None, cache=None,
         declared: dict | None = None, gpu_letterbox: bool = False):
    """A predictor over what exists: ``predictor(images)`` -> results in the original image's pixels.

    ``target``: an ONNX file, an engine plan (with its manifest.json), a cache key, or a model name (a
    recipe) whose backend runs the PyTorch module. A model name on a backend that runs a graph or an
    engine is refused: ``enginekit.load`` exports or builds it first. ``backend``: auto or a registered
    backend (``enginekit.backends``); ``predictor.backend`` and ``predictor.reason`` say what was
    chosen and why. ``fuse_attention`` (onnxruntime-cuda): run a copy of the graph with ONNX Runtime's
    fused attention (``enginekit.onnx.attention``); None: where the family declares its attention fusable.
    ``gpu_letterbox`` (a session on a GPU): resize frames there (torch bilinear) instead of letterboxing them
    on the host with OpenCV as ``YOLO(pt).predict`` does: faster for large frames, not the .pt's pixels.
    """
    p = plan_load(target, precision, backend, weights=weights, random_init=random_init, seed=seed, device=device,
                  conf=conf, iou=iou, cache=cache, declared=declared)
    return open_plan(p, conf=conf, iou=iou, max_det=max_det, input_size=input_size, cuda_graph=cuda_graph,
                     fuse_attention=fuse_attention, cache=cache, gpu_letterbox=gpu_letterbox)



# -- a predictor whose network runs elsewhere (a Triton model) ------------------------------------------
def predictor_record(plan: LoadPlan, predictor, *, conf: float, iou: float, max_det: int = 300, input_size=None,
                     max_batch: int | None = None, profiles: list | None = None) -> dict:
    """What ``predictor_from_record`` needs to rebuild the pre- and postprocessing of ``predictor`` (opened
    from ``plan``) around a network it does not hold, as JSON: the model and its graph's metadata (with the
    class names ``open_plan`` adds), the session's I/O, the options."""
    import numpy as np

    t = plan.target
    metadata = {k: str(v) for k, v in t.metadata.items()}
    if "names" not in metadata and (names := plan.adapter.default_class_names()):
        metadata["names"] = str(names)
    info = predictor.info
    return {"model": t.model, "metadata": metadata, "family": predictor.family, "variant": predictor.model,
            "precision": predictor.precision,
            "info": {"backend": "triton", "device": "cpu", "input_name": info.input_name,
                     "output_names": list(info.output_names), "input_shape": list(info.input_shape),
                     "input_dtype": str(np.dtype(info.input_dtype or np.float32)), "max_batch": max_batch,
                     "profiles": list(profiles if profiles is not None else info.profiles)},
            "options": {"conf": conf, "iou": iou, "max_det": max_det,
                        "input_size": list(input_size) if isinstance(input_size, (tuple, list)) else input_size}}


def predictor_from_record(record: dict, make_session):
    """A Predictor over ``make_session(info)`` (a session-like object: ``info`` and ``__call__``) with the
    pre- and postprocessing ``record`` (``predictor_record``) describes."""
    import numpy as np

    info = dict(record["info"])
    info["output_names"] = tuple(info["output_names"])
    info["input_shape"] = tuple(info["input_shape"])
    info["input_dtype"] = np.dtype(info["input_dtype"])
    info = SessionInfo(**info)
    metadata = dict(record["metadata"])
    adapter = resolve_recorded(record["model"], metadata)
    options = dict(record["options"])
    if isinstance(options.get("input_size"), list):
        options["input_size"] = tuple(options["input_size"])
    processor = processor_for(adapter)(adapter, metadata, info, **options)
    return Predictor(make_session(info), processor, model=record["variant"], family=record["family"],
                     reason="served by Triton", precision=record["precision"], source=record.get("net", ""))
