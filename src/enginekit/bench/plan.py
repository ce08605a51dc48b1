"""bench planning: which runners can run here, and the ONNX graphs and engines they need.

A runner is a backend's variant (``enginekit.backends``): whether it runs here is its backend's
``check``; what it needs follows from what the backend runs (the PyTorch module, the ONNX graph, an
engine per batch size). Engines are built through the build flow (``enginekit.flows.build``; the
cache makes a second run free).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enginekit.bench.settings import BenchSettings
from enginekit.errors import CapabilityError, UsageError, first_line
from enginekit.shapes import Shape, check_batch, format_shape
from enginekit.backends import variants
from enginekit.backends.base import Artifact, ENGINE, MODULE, ONNX
from enginekit.flows import run
from enginekit.flows.build import run_build
from enginekit.gpu import gpu_info
from enginekit.families.registry import graph_model
from enginekit.hashing import sha256_file
from enginekit.onnx.graph import input_dims, load_model
from enginekit.pipeline import Artifact as PipelineArtifact
from enginekit.pipeline import ModelRequest, Stages
from enginekit.requests import BuildRequest

@dataclass
class Planned:
    """One runner to measure (or skip) at every batch size."""

    name: str
    skip: str | None = None  # one reason for every batch
    failure: str | None = None  # preparing it broke (an export error, say): every batch fails with this
    onnx: Path | None = None
    engines: dict[int, Path] = field(default_factory=dict)
    engine_skips: dict[int, str] = field(default_factory=dict)  # per-batch reasons
    manifests: dict[int, dict] = field(default_factory=dict)  # per batch: the engine's manifest
    variant: Any = None  # enginekit.backends.Variant: the backend and its options

    def __post_init__(self) -> None:
        if self.variant is None:
            self.variant = variants()[self.name]

    @property
    def backend(self):
        """The backend class this runner is a variant of."""
        return self.variant.backend

    @property
    def precision(self) -> str:
        """The precision the runner itself runs at (torch's rows); "": the plan's graphs and engines."""
        return self.variant.precision or ""

    def artifact(self, plan: "BenchPlan", batch: int):
        """What the backend runs at ``batch``: the loaded module, the ONNX graph, or that batch's engine."""
        adapter = plan.adapter
        if MODULE in self.backend.runs:
            return Artifact.of_module(plan.pipeline.loaded.module, adapter.input_name, adapter.output_names,
                                      (None, *plan.image_shape))
        if ENGINE in self.backend.runs:
            return Artifact.engine(self.engines[batch], self.manifests[batch], adapter.input_name)
        return Artifact.onnx(self.onnx)


@dataclass
class BenchPlan:
    settings: BenchSettings
    adapter: Any
    pipeline: Any
    image_shape: Shape
    inputs: np.ndarray  # seeded, for the largest batch; every runner takes a slice
    items: list[Planned]
    gpu: Any  # trt.flavours.GpuInfo | None
    weights_identity: str
    source: Path | None = None  # an ONNX file benched as it is (None: a model, exported through the cache)


def input_batch(plan: BenchPlan, batch: int) -> np.ndarray:
    """The same seeded images for every runner: the first ``batch`` of one array."""
    return np.ascontiguousarray(plan.inputs[:batch])


def prepare(settings: BenchSettings, *, cache=None, quiet: bool = False) -> BenchPlan:
    """Decide what runs here and fetch (or make) the ONNX graphs and engines it needs. ``settings.model``: a model
    (a name, a checkpoint) or an ONNX file, whose graph the ONNX Runtime rows run as it is (its FP16 graph or its
    engines made from it through the cache); a file has no PyTorch module, so torch rows are skipped."""
    graph = graph_model(settings.model)
    if graph is not None:
        adapter, meta = graph
        if settings.weights is not None or settings.random_init:
            raise UsageError(f"{Path(settings.model).name} is a graph: it holds its weights (drop --weights and "
                             "--random-init)")
        source = Path(settings.model)
        fixed = _fixed_shape(source, adapter.input_name)
        image_shape = settings.image_shape or fixed or _recorded_shape(meta) or tuple(adapter.default_input[1:])
        if fixed is not None and tuple(image_shape) != fixed:
            raise UsageError(f"{source.name} takes {format_shape((1, *fixed))[2:]} inputs only, not "
                             f"{format_shape((1, *image_shape))[2:]}")
        pipe = Stages(None, cache, quiet=quiet, adapter=adapter, subject=adapter.variant)
        identity = f"onnx:{sha256_file(source)}"
    else:
        request = ModelRequest(settings.model, Path(settings.weights) if settings.weights else None,
                               settings.random_init, settings.seed)
        adapter, source, identity = request.adapter, None, request.weights_identity
        image_shape = settings.image_shape or tuple(adapter.default_input[1:])
        pipe = Stages(request, cache, quiet=quiet)
    adapter.constraint.check((1, *image_shape), what="--input")
    check_batch(max(settings.batches), image_shape, what="--batch")  # the inputs below are this big
    gpu = gpu_info()
    inputs = adapter.random_inputs((max(settings.batches), *image_shape), settings.seed)
    items = [Planned(name) for name in settings.backends]
    plan = BenchPlan(settings, adapter, pipe, image_shape, inputs, items, gpu, identity, source)
    for item in items:
        if source is not None and MODULE in item.backend.runs:
            item.skip = f"{source.name} is a graph: no PyTorch module to run (bench its checkpoint for these rows)"
    for item in items:
        item.skip = item.skip or item.backend.why_not(gpu=gpu, **item.variant.options)
        if item.skip is None:
            _prepare_item(plan, item)
    return plan


def _fixed_shape(path: Path, input_name: str) -> Shape | None:
    """(C, H, W) of a graph whose input has fixed channels, height and width; None where any is symbolic."""
    dims = input_dims(load_model(path, check=False)).get(input_name)
    if dims is None or not all(isinstance(d, int) and d > 0 for d in dims[1:]):
        return None
    return tuple(dims[1:])


def _recorded_shape(meta: dict) -> Shape | None:
    """(C, H, W) a graph records as its size (``export_shape``: what the runtime letterboxes frames to)."""
    shape = meta.get("export_shape", "")
    try:
        return tuple(int(v) for v in shape.split("x")[1:4]) if shape else None
    except ValueError:
        return None


def _prepare_item(plan: BenchPlan, item: Planned) -> None:
    """Load the model, or make the ONNX graph or engines, that ``item`` runs on.

    A failure here fails this item's rows; the other backends still run.
    """
    try:
        if MODULE in item.backend.runs:
            plan.pipeline.loaded  # load once, before the progress bar: a step of its own
        elif ONNX in item.backend.runs:
            item.onnx = _onnx_for(plan)
        elif ENGINE in item.backend.runs:
            _prepare_engines(plan, item)
    except UsageError:
        raise  # bad weights or input: the user's to fix, exit 2
    except Exception as exc:  # noqa: BLE001 - reported in the rows
        item.failure = f"preparing it failed: {first_line(exc, 200)}"


def _onnx_for(plan: BenchPlan) -> Path:
    """The cached graph ONNX Runtime runs: simplified FP32, or its FP16 AutoCast."""
    shape = (1, *plan.image_shape)
    if plan.source is not None:  # the user's graph as it is, or its FP16 graph (AutoCast, cached)
        given = PipelineArtifact.given(plan.source)
        fp16 = plan.settings.precision == "fp16" and plan.pipeline.adapter is not None
        recorded = graph_model(plan.source)[1].get("precision", "fp32")
        return plan.pipeline.fp16(given, shape).path if fp16 and recorded == "fp32" else plan.source
    chain = plan.pipeline.onnx_chain(shape, opset=plan.settings.opset, fp16=plan.settings.precision == "fp16")
    return chain[-1].path


def _prepare_engines(plan: BenchPlan, item: Planned) -> None:
    """One static engine per batch size (static shapes are the fast case; see TensorRT#3364)."""
    s = plan.settings
    build = item.backend.build_options(**item.variant.options)
    for batch in s.batches:
        profile = format_shape((batch, *plan.image_shape))
        try:
            request = BuildRequest(target=s.model, profiles=[profile], precision=s.precision, weights=s.weights,
                                   random_init=s.random_init, seed=s.seed, opset=s.opset, **build)
            outcome = run(run_build, request, plan.pipeline.cache, quiet=plan.pipeline.quiet)
        except (CapabilityError, UsageError) as exc:
            item.engine_skips[batch] = f"build failed: {exc}"
            continue
        engine = Artifact.engine(outcome.engine, outcome.manifest, plan.adapter.input_name)
        reason = item.backend.why_not(engine, gpu=plan.gpu)
        if reason is None:
            item.engines[batch] = outcome.engine
            item.manifests[batch] = outcome.manifest
        else:
            item.engine_skips[batch] = reason
