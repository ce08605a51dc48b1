"""Latency and throughput of one model on several backends, fed the same inputs.

Two phases, so a caller can show steps (model load, ONNX export, engine builds) before a
progress bar over the timed runs:

    plan = prepare(settings)   # which runners can run here; artifacts they need, from the cache
    report = measure(plan)     # warm-up, then timed runs per (runner, batch)

Each row says what its time includes: host-to-device copies (excluded, included, or not
applicable on CPU), CUDA graphs, and the clock (``perf_counter`` on CPU, CUDA events with a
synchronize after every run on GPU). A runner that cannot run here is a row marked
"skipped" with the reason, never a number. Nothing here prints.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np

from enginekit.errors import CapabilityError, UsageError
from enginekit.shapes import Shape, format_shape, parse_shape

#: every runner, in the order rows are reported
RUNNERS = (
    "torch-fp32",
    "torch-fp16",
    "torch-fp16-cudagraph",
    "onnxruntime-cpu",
    "onnxruntime-cuda",
    "tensorrt",
    "tensorrt-rtx",
)
#: what ``--backend`` accepts beyond runner names
FAMILIES = {
    "torch": ("torch-fp32", "torch-fp16", "torch-fp16-cudagraph"),
    "onnxruntime": ("onnxruntime-cpu", "onnxruntime-cuda"),
    "ort": ("onnxruntime-cpu", "onnxruntime-cuda"),
}
PRECISIONS = ("fp32", "fp16")
PERCENTILES = (50, 90, 95, 99)

# host_device_copies values
COPIES_EXCLUDED = "excluded"
COPIES_INCLUDED = "included"
COPIES_NOT_APPLICABLE = "not applicable"

Tick = Callable[[int], None]


# --- settings --------------------------------------------------------------------------


def parse_backends(text: str) -> list[str]:
    """``"torch,onnxruntime-cpu"`` -> runner names in report order; UsageError for unknown names."""
    chosen: set[str] = set()
    for item in (part.strip().lower() for part in text.split(",")):
        if not item:
            continue
        if item in FAMILIES:
            chosen.update(FAMILIES[item])
        elif item in RUNNERS:
            chosen.add(item)
        else:
            known = ", ".join(list(FAMILIES) + list(RUNNERS))
            raise UsageError(f"unknown backend {item!r}: choose from {known}")
    if not chosen:
        raise UsageError("--backend names no backend: try torch,onnxruntime,tensorrt")
    return [name for name in RUNNERS if name in chosen]


def parse_batches(text: str) -> list[int]:
    """``"1,8,16"`` -> sorted, de-duplicated positive batch sizes."""
    try:
        values = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise UsageError(f"malformed --batch {text!r}: expected positive integers like 1,8,16") from None
    if not values or min(values) <= 0:
        raise UsageError(f"malformed --batch {text!r}: expected positive integers like 1,8,16")
    return sorted(values)


def parse_image_shape(text: str) -> tuple[Shape, int | None]:
    """``HxW``, ``CxHxW`` or ``NxCxHxW`` -> ((C, H, W), N or None). C defaults to 3."""
    dims = parse_shape(text, what="--input")
    if len(dims) == 2:
        return (3, *dims), None
    if len(dims) == 3:
        return dims, None
    if len(dims) == 4:
        return dims[1:], dims[0]
    raise UsageError(f"malformed --input {text!r}: expected HxW, CxHxW or NxCxHxW")


@dataclass(frozen=True)
class BenchSettings:
    """Everything that decides what is measured."""

    model: str
    batches: tuple[int, ...] = (1,)
    image_shape: Shape | None = None  # (C, H, W); None: the family's default
    precision: str = "fp32"  # of the ONNX graph and engines; torch rows carry their own
    backends: tuple[str, ...] = ("torch-fp32", "onnxruntime-cpu")
    warmup: int = 10
    iters: int = 50
    include_copies: bool = False  # GPU rows: time host->device input and device->host output copies
    threads: int | None = None  # CPU rows: intra-op threads of torch and ONNX Runtime (None: their default)
    weights: Path | None = None
    random_init: bool = False
    seed: int = 0
    opset: int = 18

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise UsageError(f"unknown precision {self.precision!r}: choose {', '.join(PRECISIONS)}")
        if self.iters < 2:
            raise UsageError(f"--iters must be at least 2, not {self.iters}")
        if self.threads is not None and self.threads <= 0:
            raise UsageError(f"--threads must be positive, not {self.threads}")
        if self.warmup < 0:
            raise UsageError(f"--warmup must not be negative, not {self.warmup}")
        unknown = [b for b in self.backends if b not in RUNNERS]
        if unknown:
            raise UsageError(f"unknown backend {unknown[0]!r}: choose from {', '.join(RUNNERS)}")
        if not self.batches or min(self.batches) <= 0:
            raise UsageError("--batch needs positive batch sizes")

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "batches": list(self.batches),
            "precision": self.precision,
            "backends": list(self.backends),
            "warmup": self.warmup,
            "iters": self.iters,
            "include_copies": self.include_copies,
            "threads": self.threads,
            "seed": self.seed,
            "opset": self.opset,
        }


# --- statistics ------------------------------------------------------------------------


def latency_stats(samples_ms: np.ndarray | list[float]) -> dict[str, float]:
    """p50/p90/p95/p99, mean, std, min and max of per-run latencies, in milliseconds."""
    samples = np.asarray(samples_ms, dtype=np.float64)
    stats = {f"p{q}": float(np.percentile(samples, q)) for q in PERCENTILES}
    stats.update(mean=float(samples.mean()), std=float(samples.std()), min=float(samples.min()),
                 max=float(samples.max()))
    return {k: round(v, 4) for k, v in stats.items()}


def throughput(batch: int, mean_ms: float) -> float:
    """Images per second of back-to-back runs, one batch at a time."""
    return round(batch * 1000.0 / mean_ms, 2) if mean_ms > 0 else 0.0


# --- rows ------------------------------------------------------------------------------


@dataclass
class BenchRow:
    """One runner at one batch size: numbers, or why there are none."""

    backend: str
    batch: int
    status: str  # ok | skipped | failed
    reason: str | None = None
    device: str | None = None  # "cpu" or the GPU's name; None when nothing ran
    precision: str = "fp32"
    host_device_copies: str | None = None  # excluded | included | not applicable
    cuda_graph: bool | None = None
    timer: str | None = None  # perf_counter | cuda-events
    detail: str = ""
    latency_ms: dict[str, float] | None = None
    throughput_ips: float | None = None
    iters: int = 0
    warmup: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


# --- timing ----------------------------------------------------------------------------


def time_cpu(run: Callable[[], Any], warmup: int, iters: int, tick: Tick) -> np.ndarray:
    """Warm-up, then ``iters`` runs timed with perf_counter; milliseconds per run."""
    for _ in range(warmup):
        run()
        tick(1)
    samples = np.empty(iters)
    for i in range(iters):
        start = time.perf_counter()
        run()
        samples[i] = (time.perf_counter() - start) * 1000.0
        tick(1)
    return samples


def time_cuda(run: Callable[[], Any], warmup: int, iters: int, tick: Tick, stream=None) -> np.ndarray:
    """Warm-up, then ``iters`` runs between CUDA events, synchronized after each run.

    Synchronizing each run measures one request's latency, not a pipelined rate; the events
    sit on the stream the work is queued on, so launch gaps count too.
    """
    import torch

    with torch.cuda.stream(stream):  # None: the current stream
        for _ in range(warmup):
            run()
            torch.cuda.current_stream().synchronize()
            tick(1)
        samples = np.empty(iters)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(iters):
            start.record()
            run()
            end.record()
            end.synchronize()
            samples[i] = start.elapsed_time(end)
            tick(1)
    return samples


# --- runners ---------------------------------------------------------------------------


@dataclass
class Runner:
    """One prepared inference at one batch size: ``run()`` does it once."""

    run: Callable[[], Any]
    device: str
    copies: str
    cuda_graph: bool = False
    detail: str = ""
    stream: Any = None  # a torch.cuda.Stream the work is queued on (None: the current one)
    close: Callable[[], None] = lambda: None

    @property
    def timer(self) -> str:
        return "perf_counter" if self.device == "cpu" else "cuda-events"


def _torch_runner(name: str, module, batch: np.ndarray, include_copies: bool, threads: int | None) -> Runner:
    """Eager PyTorch (FP32 on CPU or GPU; FP16 on GPU), or FP16 replayed from a CUDA graph."""
    import copy

    import torch

    model = _fixed_shape(copy.deepcopy(module))  # the shared module stays as export needs it
    if name == "torch-fp32" and not torch.cuda.is_available():
        if threads is not None:
            torch.set_num_threads(threads)
        x = torch.from_numpy(batch)

        def run_cpu():
            with torch.inference_mode():
                model(x)

        return Runner(run_cpu, "cpu", COPIES_NOT_APPLICABLE, detail=f"{torch.get_num_threads()} intra-op threads")
    dtype = torch.float16 if name.startswith("torch-fp16") else torch.float32
    model = model.to("cuda", dtype)
    host = torch.from_numpy(batch)
    x = host.to("cuda", dtype)
    device = torch.cuda.get_device_name()
    copies = COPIES_INCLUDED if include_copies else COPIES_EXCLUDED
    if name == "torch-fp16-cudagraph":
        return _cuda_graph_runner(model, x, host, include_copies, device, copies)

    def run_gpu():
        with torch.inference_mode():
            out = model(host.to("cuda", dtype, non_blocking=False) if include_copies else x)
            if include_copies:
                _to_host(out)

    return Runner(run_gpu, device, copies, close=lambda: _free_cuda(model))


def _fixed_shape(model):
    """Let shape-dependent constants be computed once, on the first run: a runner feeds one shape.

    A head prepared for export with a ``dynamic`` flag (Ultralytics' Detect) otherwise rebuilds
    its anchors on every call from host-side ``arange`` tensors: a host copy per run, which is not
    what a deployed model does and which a CUDA graph cannot capture.
    """
    for sub in model.modules():
        if isinstance(getattr(sub, "dynamic", None), bool):
            sub.dynamic = False
    return model


def _cuda_graph_runner(model, x, host, include_copies: bool, device: str, copies: str) -> Runner:
    """Capture one forward in a CUDA graph (static input buffer), then replay it."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):  # lazy initialisation (cuDNN/cuBLAS handles, autotuning) before capture
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = model(x)

    def run():
        if include_copies:
            x.copy_(host)
        graph.replay()
        if include_copies:
            _to_host(out)

    return Runner(run, device, copies, cuda_graph=True, close=lambda: _free_cuda(model))


def _to_host(out) -> None:
    for tensor in out if isinstance(out, (tuple, list)) else (out,):
        if hasattr(tensor, "cpu"):
            tensor.cpu()


def _free_cuda(model) -> None:
    import torch

    model.to("cpu")
    torch.cuda.empty_cache()


def _onnxruntime_runner(name: str, onnx_path: Path, input_name: str, batch: np.ndarray,
                        threads: int | None) -> Runner:
    """ONNX Runtime with numpy feeds: on CUDA that copies the input in and outputs out every run."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
    wanted = ["CUDAExecutionProvider", "CPUExecutionProvider"] if name == "onnxruntime-cuda" else [
        "CPUExecutionProvider"]
    session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=wanted)
    if session.get_providers()[0] != wanted[0]:
        raise CapabilityError(f"ONNX Runtime did not load {wanted[0]} (it fell back to {session.get_providers()[0]})")
    feeds = {input_name: batch}

    def run():
        session.run(None, feeds)

    if name == "onnxruntime-cuda":
        from enginekit.trt.backends import gpu_info

        return Runner(run, str(gpu_info() or "cuda"), COPIES_INCLUDED, detail="numpy feeds (no I/O binding)")
    return Runner(run, "cpu", COPIES_NOT_APPLICABLE, detail=f"{threads or 'default'} intra-op threads")


_TRT_TO_TORCH = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
                 "INT8": "int8", "UINT8": "uint8", "BOOL": "bool"}


def _tensorrt_runner(backend, plan_path: Path, batch: np.ndarray, include_copies: bool, static: bool) -> Runner:
    """Run a plan through the backend's own API, with torch CUDA tensors as I/O buffers.

    A static engine is replayed from a CUDA graph (after one ordinary run, which TensorRT
    needs before capture); if capture fails the row says so and runs without one.
    """
    import torch

    trt = backend.module
    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
    if engine is None:
        raise CapabilityError(f"{backend.label} could not deserialize {plan_path}")
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    if len(inputs) != 1:
        raise CapabilityError(f"bench feeds one input; the engine has {len(inputs)}")
    context.set_input_shape(inputs[0], tuple(batch.shape))
    buffers = {}
    for name in names:
        dtype = getattr(torch, _TRT_TO_TORCH[engine.get_tensor_dtype(name).name])
        buffers[name] = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtype, device="cuda")
        context.set_tensor_address(name, buffers[name].data_ptr())
    host = torch.from_numpy(batch)
    buffers[inputs[0]].copy_(host)
    outputs = [buffers[n] for n in names if n not in inputs]
    stream = torch.cuda.Stream()

    def enqueue():
        if not context.execute_async_v3(stream.cuda_stream):
            raise CapabilityError(f"{backend.label} failed to enqueue the engine")

    detail = "static shape" if static else "dynamic-shape engine"
    graph = None
    if static:
        graph, note = _capture_engine(enqueue, stream)
        detail += f"; {note}"
    step = graph.replay if graph is not None else enqueue

    def run():
        if include_copies:
            buffers[inputs[0]].copy_(host, non_blocking=False)
        step()
        if include_copies:
            for out in outputs:
                out.cpu()

    keep_alive = [runtime, engine, context]  # the context needs its engine and runtime while it runs

    def close():
        buffers.clear()
        keep_alive.clear()
        torch.cuda.empty_cache()

    copies = COPIES_INCLUDED if include_copies else COPIES_EXCLUDED
    return Runner(run, torch.cuda.get_device_name(), copies, cuda_graph=graph is not None, detail=detail,
                  stream=stream, close=close)


def _capture_engine(enqueue: Callable[[], None], stream) -> tuple[Any, str]:
    import torch

    with torch.cuda.stream(stream):
        enqueue()  # TensorRT sets up shape-dependent state on the first run, outside capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            enqueue()
    except Exception as exc:  # noqa: BLE001 - reported in the row, run without a graph
        torch.cuda.synchronize()
        return None, f"CUDA graph capture failed ({_one_line(exc)})"
    return graph, "CUDA graph"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


# --- planning --------------------------------------------------------------------------


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
    from enginekit.pipeline import ModelRequest, Pipeline
    from enginekit.trt.backends import gpu_info

    request = ModelRequest(settings.model, Path(settings.weights) if settings.weights else None,
                           settings.random_init, settings.seed)
    adapter = request.adapter
    image_shape = settings.image_shape or tuple(adapter.default_input[1:])
    adapter.constraint.check((1, *image_shape), what="--input")
    pipe = Pipeline(request, cache, quiet=quiet)
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
        item.failure = f"preparing it failed: {_one_line(exc)}"


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
    from enginekit import api
    from enginekit.trt.backends import resolve_backend
    from enginekit.trt.builder import can_run_here

    s = plan.settings
    requested = "auto" if item.name == "tensorrt" else item.name
    item.backend = resolve_backend(requested)
    for batch in s.batches:
        profile = format_shape((batch, *plan.image_shape))
        try:
            outcome = api.build(s.model, profiles=[profile], precision=s.precision, backend=requested,
                                weights=s.weights, random_init=s.random_init, seed=s.seed, opset=s.opset,
                                cache=plan.pipeline.cache, quiet=plan.pipeline.quiet)
        except (CapabilityError, UsageError) as exc:
            item.engine_skips[batch] = f"build failed: {exc}"
            continue
        ok, reason = can_run_here(item.backend, outcome.manifest, plan.gpu)
        if ok:
            item.engines[batch] = outcome.engine
        else:
            item.engine_skips[batch] = reason


# --- measuring -------------------------------------------------------------------------


def runs_per_row(settings: BenchSettings) -> int:
    return settings.warmup + settings.iters


def total_runs(plan: BenchPlan) -> int:
    """How many runs ``measure`` will make (for a progress bar)."""
    measured = sum(len(plan.settings.batches) - len(i.engine_skips) for i in plan.items
                   if i.skip is None and i.failure is None)
    return measured * runs_per_row(plan.settings)


@dataclass
class BenchReport:
    plan: BenchPlan
    rows: list[BenchRow]
    created: str

    @property
    def measured(self) -> list[BenchRow]:
        return [r for r in self.rows if r.status == "ok"]

    def to_json(self) -> dict[str, Any]:
        from enginekit import __version__

        plan = self.plan
        return {
            "enginekit_version": __version__,
            "created": self.created,
            "model": plan.adapter.variant,
            "weights": plan.weights_identity,
            "input": {
                "name": plan.adapter.input_name,
                "image_shape": list(plan.image_shape),
                "data": f"seeded random (seed {plan.settings.seed}); every backend gets the same array",
            },
            "settings": plan.settings.to_json(),
            "timing": {
                "latency": "milliseconds per run (one batch), synchronized after each run",
                "throughput_ips": "batch x 1000 / mean latency: images per second, one batch at a time",
                "host_device_copies": "excluded: inputs already on the GPU; included: every run copies the "
                                      "input from host memory and the outputs back; not applicable: CPU",
            },
            "machine": machine_info(plan.gpu),
            "results": [r.to_json() for r in self.rows],
        }


def measure(plan: BenchPlan, tick: Tick = lambda n: None) -> BenchReport:
    """Time every planned runner at every batch size; skipped runners become skipped rows."""
    rows = []
    for item in plan.items:
        for batch in plan.settings.batches:
            rows.append(_measure_one(plan, item, batch, tick))
    return BenchReport(plan, rows, datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _measure_one(plan: BenchPlan, item: Planned, batch: int, tick: Tick) -> BenchRow:
    s = plan.settings
    precision = item.precision or s.precision
    reason = item.skip or item.engine_skips.get(batch)
    if reason is not None:
        return BenchRow(item.name, batch, "skipped", reason, precision=precision)
    if item.failure is not None:
        return BenchRow(item.name, batch, "failed", item.failure, precision=precision)
    runner = None
    done = 0

    def counted(n: int) -> None:
        nonlocal done
        done += n
        tick(n)

    try:
        runner = _make_runner(plan, item, batch)
        timer = time_cpu if runner.device == "cpu" else time_cuda
        kwargs = {} if runner.device == "cpu" else {"stream": runner.stream}
        samples = timer(runner.run, s.warmup, s.iters, counted, **kwargs)
    except Exception as exc:  # noqa: BLE001 - one backend failing (out of memory, say) is a row, not a crash
        tick(runs_per_row(s) - done)
        return BenchRow(item.name, batch, "failed", _one_line(exc), precision=precision)
    finally:
        if runner is not None:
            runner.close()
    stats = latency_stats(samples)
    return BenchRow(item.name, batch, "ok", None, device=runner.device, precision=precision,
                    host_device_copies=runner.copies, cuda_graph=runner.cuda_graph, timer=runner.timer,
                    detail=runner.detail, latency_ms=stats, throughput_ips=throughput(batch, stats["mean"]),
                    iters=s.iters, warmup=s.warmup)


def _make_runner(plan: BenchPlan, item: Planned, batch: int) -> Runner:
    data = input_batch(plan, batch)
    if item.name.startswith("torch-"):
        return _torch_runner(item.name, plan.pipeline.loaded.module, data, plan.settings.include_copies,
                             plan.settings.threads)
    if item.name.startswith("onnxruntime-"):
        return _onnxruntime_runner(item.name, item.onnx, plan.adapter.input_name, data, plan.settings.threads)
    runner = _tensorrt_runner(item.backend, item.engines[batch], data, plan.settings.include_copies, static=True)
    runner.detail = f"{item.backend.label}; {runner.detail}"
    return runner


# --- the machine -----------------------------------------------------------------------


def cpu_name() -> str:
    """The processor's model name (Linux /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(gpu) -> dict[str, Any]:
    import os

    from enginekit.pipeline import package_version

    return {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "gpu": gpu.to_json() if gpu is not None else None,
        "versions": {name: package_version(name) for name in
                     ("torch", "onnxruntime", "onnxruntime-gpu", "tensorrt", "tensorrt-rtx")},
    }


# --- plot ------------------------------------------------------------------------------


def plot(report: BenchReport, path: Path) -> Path:
    """Latency (p50, bars to p99) and throughput against batch size, one line per backend."""
    try:
        import matplotlib
    except ImportError:
        raise CapabilityError("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (lat_ax, tput_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for backend in dict.fromkeys(r.backend for r in report.measured):
        rows = sorted((r for r in report.measured if r.backend == backend), key=lambda r: r.batch)
        batches = [r.batch for r in rows]
        p50 = np.array([r.latency_ms["p50"] for r in rows])
        p99 = np.array([r.latency_ms["p99"] for r in rows])
        lat_ax.errorbar(batches, p50, yerr=[np.zeros_like(p50), p99 - p50], marker="o", capsize=3, label=backend)
        tput_ax.plot(batches, [r.throughput_ips for r in rows], marker="o", label=backend)
    plan = report.plan
    shape = "x".join(map(str, plan.image_shape))
    lat_ax.set(xlabel="batch", ylabel="latency ms (p50, bar to p99)", title=f"{plan.adapter.variant} {shape}")
    tput_ax.set(xlabel="batch", ylabel="images / s", title="throughput")
    for ax in (lat_ax, tput_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(plan.settings.batches, [str(b) for b in plan.settings.batches])
        ax.grid(True, alpha=0.3)
    lat_ax.set_yscale("log")  # backends differ by orders of magnitude
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    lat_ax.yaxis.set_major_formatter(plain)
    lat_ax.yaxis.set_minor_formatter(plain)
    lat_ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
