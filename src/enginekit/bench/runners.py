"""bench runners: one prepared inference per backend and batch size, and the clocks that time them.

``time_cpu`` uses ``perf_counter``; ``time_cuda`` CUDA events with a synchronize after every run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from enginekit.errors import CapabilityError

Tick = Callable[[int], None]

# host_device_copies values
COPIES_EXCLUDED = "excluded"
COPIES_INCLUDED = "included"
COPIES_NOT_APPLICABLE = "not applicable"

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
    timer: str = ""  # perf_counter | cuda-events; by default perf_counter on CPU, CUDA events on a GPU

    def __post_init__(self) -> None:
        if not self.timer:
            self.timer = "perf_counter" if self.device == "cpu" else "cuda-events"

    def time(self, warmup: int, iters: int, tick: Tick) -> np.ndarray:
        """Milliseconds per run of ``iters`` runs after ``warmup``, on this runner's clock."""
        if self.timer == "perf_counter":
            return time_cpu(self.run, warmup, iters, tick)
        return time_cuda(self.run, warmup, iters, tick, stream=self.stream)


def torch_runner(name: str, module, batch: np.ndarray, include_copies: bool, threads: int | None) -> Runner:
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

    from enginekit.runtime.backends import capture_graph

    def forward():
        with torch.no_grad():
            return model(x)

    for _ in range(2):  # lazy initialisation (cuDNN/cuBLAS handles, autotuning) before capture
        forward()
    graph, out = capture_graph(forward, x.device)

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


def onnxruntime_runner(name: str, onnx_path: Path, input_name: str, batch: np.ndarray,
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
        from enginekit.gpu import gpu_info

        return Runner(run, str(gpu_info() or "cuda"), COPIES_INCLUDED, detail="numpy feeds (no I/O binding)")
    return Runner(run, "cpu", COPIES_NOT_APPLICABLE, detail=f"{threads or 'default'} intra-op threads")


def tensorrt_runner(backend, plan_path: Path, input_name: str, batch: np.ndarray, include_copies: bool) -> Runner:
    """A static-shape engine through polygraphy's TrtRunner (trt/runner.py), synchronized per run."""
    from enginekit.gpu import gpu_info
    from enginekit.trt.runner import repeat_runner

    opened = repeat_runner(plan_path, backend, {input_name: batch}, include_copies=include_copies)
    run = opened.__enter__()
    copies = COPIES_INCLUDED if include_copies else COPIES_EXCLUDED
    return Runner(run, str(gpu_info() or "cuda"), copies, detail=f"{backend.label}; static shape; polygraphy TrtRunner",
                  timer="perf_counter", close=lambda: opened.__exit__(None, None, None))
