"""bench planning: which runners can run here, and the ONNX graphs and engines they need.

Engines are built through the build flow (``enginekit.flows.build``) (the cache makes a second run free).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enginekit.bench.settings import BenchSettings
from enginekit.errors import CapabilityError, UsageError, first_line
from enginekit.shapes import Shape, check_batch, format_shape

@dataclass
class Planned:
    """One runner to measure (or skip) at every batch size."""

    name: str
    skip: str | None = None  # one reason for every batch
    failure: str | None = None  # preparing it broke (an export error, say): every batch fails with this
    onnx: Path | None = None
    engines: dict[int, Path] = field(default_factory=dict)
    engine_skips: dict[int, str] = field(default_factory=dict)  # per-batch reasons
    backend: Any = None  # trt.backends.Backend for engine rows

    @property
    def precision(self) -> str:
        if self.name.startswith("torch-"):
            return self.name.split("-")[1]
        return ""


@dataclass
class BenchPlan:
    settings: BenchSettings
    adapter: Any
    pipeline: Any
    image_shape: Shape
    inputs: np.ndarray  # seeded, for the largest batch; every runner takes a slice
    items: list[Planned]
    gpu: Any  # trt.backends.GpuInfo | None
    weights_identity: str


def input_batch(plan: BenchPlan, batch: int) -> np.ndarray:
    """The same seeded images for every runner: the first ``batch`` of one array."""
    return np.ascontiguousarray(plan.inputs[:batch])


def prepare(settings: BenchSettings, *, cache=None, quiet: bool = False) -> BenchPlan:
    """Decide what runs here and fetch (or make) the ONNX graphs and engines it needs."""
    from enginekit.pipeline import ModelRequest, Stages
    from enginekit.gpu import gpu_info

    request = ModelRequest(settings.model, Path(settings.weights) if settings.weights else None,
                           settings.random_init, settings.seed)
    adapter = request.adapter
    image_shape = settings.image_shape or tuple(adapter.default_input[1:])
    adapter.constraint.check((1, *image_shape), what="--input")
    check_batch(max(settings.batches), image_shape, what="--batch")  # the inputs below are this big
    pipe = Stages(request, cache, quiet=quiet)
    gpu = gpu_info()
    inputs = adapter.random_inputs((max(settings.batches), *image_shape), settings.seed)
    items = [Planned(name) for name in settings.backends]
    plan = BenchPlan(settings, adapter, pipe, image_shape, inputs, items, gpu, request.weights_identity)
    for item in items:
        item.skip = _skip_reason(item.name, gpu)
        if item.skip is None:
            _prepare_item(plan, item)
    return plan


def _prepare_item(plan: BenchPlan, item: Planned) -> None:
    """Load the model, or make the ONNX graph or engines, that ``item`` runs on.

    A failure here fails this item's rows; the other backends still run.
    """
    try:
        if item.name.startswith("torch-"):
            plan.pipeline.loaded  # load once, before the progress bar: a step of its own
        elif item.name.startswith("onnxruntime-"):
            item.onnx = _onnx_for(plan)
        else:
            _prepare_engines(plan, item)
    except UsageError:
        raise  # bad weights or input: the user's to fix, exit 2
    except Exception as exc:  # noqa: BLE001 - reported in the rows
        item.failure = f"preparing it failed: {first_line(exc, 200)}"


def _skip_reason(name: str, gpu) -> str | None:
    """Why ``name`` cannot run on this machine, before any work; None when it can."""
    if name.startswith("torch-"):
        return _torch_skip_reason(name)
    if name.startswith("onnxruntime-"):
        return _onnxruntime_skip_reason(name, gpu)
    return _engine_skip_reason(name, gpu)


def _torch_skip_reason(name: str) -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if name == "torch-fp32" or torch.cuda.is_available():
        return None
    what = "CUDA graphs need" if "cudagraph" in name else "FP16 eager timing needs"
    return f"{what} a CUDA GPU; torch sees none (CPU FP16 says nothing about deployment)"


def _onnxruntime_skip_reason(name: str, gpu) -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed: pip install onnxruntime-gpu"
    if name == "onnxruntime-cpu":
        return None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "this onnxruntime has no CUDA provider: pip install onnxruntime-gpu"
    if gpu is None:
        return "no GPU on this machine: the CUDA provider needs one"
    return None


def _engine_skip_reason(name: str, gpu) -> str | None:
    """Predict ``can_run_here`` for the engine a build would make, before building it."""
    from enginekit.trt.backends import resolve_backend, resolve_targets
    from enginekit.trt.builder import BuiltFor, can_run_here

    try:
        backend = resolve_backend("auto" if name == "tensorrt" else name)
    except (CapabilityError, UsageError) as exc:
        return "no GPU on this machine; " + str(exc) if gpu is None else str(exc)
    if gpu is None:
        return f"no GPU on this machine: {backend.label} engines run only on an NVIDIA GPU"
    targets = resolve_targets(backend, None, gpu)
    ok, reason = can_run_here(backend, BuiltFor(backend.name, backend.version, targets, gpu), gpu)
    return None if ok else f"no engine it builds would run here: {reason}"


def _onnx_for(plan: BenchPlan) -> Path:
    """The cached graph ONNX Runtime runs: simplified FP32, or its FP16 AutoCast."""
    shape = (1, *plan.image_shape)
    chain = plan.pipeline.onnx_chain(shape, opset=plan.settings.opset, fp16=plan.settings.precision == "fp16")
    return chain[-1].path


def _prepare_engines(plan: BenchPlan, item: Planned) -> None:
    """One static engine per batch size (static shapes are the fast case; see TensorRT#3364)."""
    from enginekit.flows import run
    from enginekit.flows.build import run_build
    from enginekit.requests import BuildRequest
    from enginekit.trt.backends import resolve_backend
    from enginekit.trt.builder import can_run_here

    s = plan.settings
    requested = "auto" if item.name == "tensorrt" else item.name
    item.backend = resolve_backend(requested)
    for batch in s.batches:
        profile = format_shape((batch, *plan.image_shape))
        try:
            request = BuildRequest(target=s.model, profiles=[profile], precision=s.precision, backend=requested,
                                   weights=s.weights, random_init=s.random_init, seed=s.seed, opset=s.opset)
            outcome = run(run_build, request, plan.pipeline.cache, quiet=plan.pipeline.quiet)
        except (CapabilityError, UsageError) as exc:
            item.engine_skips[batch] = f"build failed: {exc}"
            continue
        ok, reason = can_run_here(item.backend, outcome.manifest, plan.gpu)
        if ok:
            item.engines[batch] = outcome.engine
        else:
            item.engine_skips[batch] = reason
