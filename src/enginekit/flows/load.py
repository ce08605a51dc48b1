"""``enginekit.load``: resolve the target, make what its backend needs, then hand it to the runtime.

The runtime only loads (``enginekit.runtime.loader``). Here a model name becomes the artifact its
backend runs: an ONNX graph through the export flow, an engine through the build flow, both cached
(a second load does no work); then ``open_plan`` loads it. ``predictor.backend`` and
``predictor.reason`` say what was chosen and why, as the runtime's own ``load`` does.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from enginekit import backends
from enginekit.backends.base import ENGINE, ONNX
from enginekit.errors import UsageError
from enginekit.precisions import names as precision_names
from enginekit.runtime.loader import LoadPlan, open_plan, plan_load
from enginekit.cache import Cache
from enginekit.errors import ParityError
from enginekit.families.checkpoints import is_qat_checkpoint
from enginekit.families.torch_models.spec import FLAGS, declaration
from enginekit.flows import run
from enginekit.flows.build import run_build
from enginekit.flows.export import run_export
from enginekit.recipes import load_recipe
from enginekit.requests import BuildRequest, ExportRequest, check_types, image_size, unknown_name
from enginekit.verification.record import engine_record



def load(target, precision: str = "fp32", backend: str = "auto", *, weights=None, random_init: bool = False,
         seed: int = 0, device: str | None = None, conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
         input_size=None, cuda_graph: bool | None = None, fuse_attention: bool | None = None, cache=None,
         quiet: bool = True, gpu_letterbox: bool = False, imgsz=None, **build_options):
    """A predictor over ``target``: ``predictor(images)`` -> results in the original image's pixels.

    ``target``: a model name (exported or built through the cache as its backend needs, with ``weights``
    or ``random_init``), a cache key, a recipe, an engine plan (with its manifest.json) or an ONNX file.
    ``backend``: auto or a registered backend (``enginekit.backends.choices()``). ``build_options``:
    BuildRequest fields for an engine built here (profiles, target_cc, ...), and what a model enginekit cannot
    know by itself declares (``task``, ``outputs``, ``size``, ``dynamic``, ``mean``, ``std``, ``resize``,
    ``bgr``, ``classes``: ``families.torch_models.spec``). ``gpu_letterbox``: YOLO frames resized on the GPU
    (opt-in; default: Ultralytics' OpenCV letterbox on the host, the .pt's input bit for bit). The rest: the
    runtime's ``load`` (``enginekit.runtime.loader.load``).
    """
    check_types(precision=(precision, str), backend=(backend, str), random_init=(random_init, bool),
                seed=(seed, int), device=(device, (str, None)), conf=(conf, (float, int)), iou=(iou, (float, int)),
                max_det=(max_det, int), cuda_graph=(cuda_graph, (bool, None)),
                fuse_attention=(fuse_attention, (bool, None)), quiet=(quiet, bool),
                gpu_letterbox=(gpu_letterbox, bool), imgsz=(imgsz, (int, str, None)),
                input_size=(input_size, (int, tuple, list, None)))
    check_load_options(build_options)
    if imgsz is not None:  # Ultralytics' word for it: 320 or "384x640"
        if input_size is not None:
            raise UsageError(f"imgsz={imgsz!r} and input_size={input_size!r} both give the input size: give one")

        h, w = image_size(str(imgsz), "imgsz")
        input_size = h if h == w else (h, w)
    backend, input_size, build_options = _recipe_runtime(target, backend, input_size, build_options)
    declared = declaration(**{k: build_options.pop(k) for k in (*FLAGS, "bgr") if k in build_options})
    p = plan_load(target, precision, backend, weights=weights, random_init=random_init, seed=seed, device=device,
                  conf=conf, iou=iou, cache=cache, declared=declared)
    shape = _input_shape(p.adapter, input_size)
    if p.missing == ONNX:
        p = p.with_onnx(export_onnx(p, cache, quiet, shape if not _dynamic_hw(p.adapter) else None))
    elif p.missing == ENGINE:
        if shape is not None and not build_options.get("profiles"):  # an engine for the size asked for
            build_options = {**build_options, "profiles": ["x".join(map(str, shape))]}
        p = build_engine(p, cache, quiet, build_options)
    elif p.missing is not None:
        raise UsageError(f"enginekit makes no {p.missing} artifact for the {p.backend.name} backend")
    return open_plan(p, conf=conf, iou=iou, max_det=max_det, input_size=input_size, cuda_graph=cuda_graph,
                     fuse_attention=fuse_attention, cache=cache, gpu_letterbox=gpu_letterbox)


def load_option_names() -> set[str]:
    """Every keyword ``load`` takes: its own, an engine build's (``BuildRequest``), a model declaration's."""
    import inspect

    own = set(inspect.signature(load).parameters) - {"build_options"}
    return own | set(BuildRequest.model_fields) | set(FLAGS) | {"bgr"}


def check_load_options(build_options: dict) -> None:
    """A keyword ``load`` does not take is one ``UsageError`` naming the closest it does (it was ignored)."""
    known = set(BuildRequest.model_fields) - {"target"}

    known |= set(FLAGS) | {"bgr"}
    for name in build_options:
        if name not in known:
            raise UsageError(unknown_name(name, load_option_names()))


def _recipe_runtime(target, backend: str, input_size, build_options: dict):
    """A recipe's ``runtime:`` (what ``enginekit tune`` chose): its backend and input where none is given,
    and its profiles for an engine."""
    if not str(target).endswith((".yaml", ".yml")):
        return backend, input_size, build_options

    recipe = load_recipe(str(target))
    runtime = recipe.runtime
    if runtime is not None:
        if backend == backends.AUTO:
            backend = runtime.backend
        if input_size is None:
            input_size = runtime.input_size()
    if recipe.profiles and not build_options.get("profiles"):
        build_options = {**build_options, "profiles": list(recipe.profiles)}
    return backend, input_size, build_options


def _dynamic_hw(adapter) -> bool:
    """The family's graphs take any H x W (Depth-Anything) rather than the size they were exported at (YOLO)."""
    return 2 in adapter.dynamic_axes.get(adapter.input_name, {})


def _input_shape(adapter, input_size) -> tuple[int, ...] | None:
    """``input_size`` as the batch-1 input it makes: an (H, W), or a side of a family whose graphs have a
    fixed H x W; None where the frame decides (Depth-Anything's shorter side) or nothing was asked."""
    if input_size is None:
        return None
    side = isinstance(input_size, int)
    h, w = (input_size, input_size) if side else (int(v) for v in input_size)
    shape = (1, int(adapter.default_input[1]), h, w)
    adapter.constraint.check(shape, what="input size")  # a YOLO at 321 would fail on its first frame, not here
    return None if side and _dynamic_hw(adapter) else shape


def simplifier() -> str:
    """onnxsim where it is installed, else onnxslim."""
    import importlib.util

    return "onnxsim" if importlib.util.find_spec("onnxsim") else "onnxslim"


def export_onnx(p: LoadPlan, cache, quiet: bool, shape: tuple[int, ...] | None = None) -> Path:
    """The cached, parity-checked graph of ``p``'s model at its precision (fp32 or fp16); ``shape``: the
    input it is exported at (default: the family's)."""
    t, precision = p.target, p.precision
    # a quantization-aware checkpoint's exported graph is its INT8 (the trained Q/DQ ranges): ONNX Runtime runs it
    qat = precision == "int8" and t.weights is not None and is_qat_checkpoint(Path(t.weights))
    if not qat and (precision not in precision_names(exported=True)
                    or (p.backend.precisions and precision not in p.backend.precisions)):
        engines = " or ".join(b.name for b in backends.running(ENGINE))
        raise UsageError(f"{p.backend.label} runs fp32 and fp16 graphs of a model name; {precision} needs the "
                         f"{engines} backend, {_graph_to_load(t, precision, cache)}")
    with tempfile.TemporaryDirectory() as tmp:
        request = ExportRequest(model=t.model, fp16=precision == "fp16", output=Path(tmp) / "model.onnx",
                                input="x".join(map(str, shape)) if shape else None,
                                weights=t.weights, random_init=t.random_init, seed=t.seed, simplifier=simplifier(),
                                declared=t.request.declared if t.request else {})
        result = run(run_export, request, cache, quiet=quiet)
    if not result.passed:
        raise ParityError(f"{t.model} {precision} failed its parity gate: " + "; ".join(result.failures()))
    return result.artifacts[-1].path


def _graph_to_load(t, precision: str, cache) -> str:
    """Where the ``precision`` graph a build made of ``t``'s model lies (the newest engine's source graph), as the
    command that loads it; else the build that makes one."""
    if t.request is not None:
        for entry in (cache or Cache()).engines_of(t.request.weights_identity, precision, nms=t.request.nms):
            if engine_record(cache or Cache(), entry.manifest).failed:
                continue  # a hint never names a graph that failed a check
            link = (entry.manifest.get("chain") or [{}])[-1]
            found = (cache or Cache()).lookup(link["kind"], link["key"]).entry if "kind" in link else None
            if found is not None:
                return f"or load the {precision} graph `enginekit build` made: {found.file('model.onnx')}"
    name = t.request.checkpoint.name if t.request is not None and t.request.checkpoint is not None else t.model
    return (f"or build its {precision} graph first (enginekit build {name} --precision {precision} --calib-data DIR), "
            "then load the graph it prints")


def build_engine(p: LoadPlan, cache, quiet: bool, build_options: dict) -> LoadPlan:
    """``p`` over the cached engine of its model at its precision (built here if missing)."""
    t = p.target
    opts = {k: v for k, v in build_options.items() if v is not None}
    declared = t.request.declared if t.request else {}
    request = BuildRequest(target=t.model, precision=p.precision, weights=t.weights, random_init=t.random_init,
                           seed=t.seed, declared=declared, **opts)
    outcome = run(run_build, request, cache, quiet=quiet)
    if outcome.resolution:  # found by identity in the team store: which entry and why
        p = replace(p, reason=f"{p.reason}; {outcome.resolution}")
    return p.with_engine(outcome.engine, outcome.manifest, f"engine {outcome.entry.key[:12]}", cache or Cache())
