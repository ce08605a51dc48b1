"""Run an engine plan with device buffers that stay on the GPU (TensorRT or TensorRT-RTX).

The predictor's hot path: the optimization profile is chosen by the input's shape, output
buffers are allocated once per shape and reused, and work is queued on the caller's CUDA
stream (``execute_async_v3``); nothing is copied to the host here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from enginekit.errors import CapabilityError, UsageError


def profile_for(shape: tuple[int, ...], profiles: list[dict], input_name: str) -> int:
    """Index of the first optimization profile whose min..max holds ``shape``; UsageError if none."""
    for i, profile in enumerate(profiles):
        rng = profile[input_name]
        if len(rng["min"]) == len(shape) and all(lo <= s <= hi for s, lo, hi in zip(shape, rng["min"], rng["max"])):
            return i
    ranges = "; ".join(
        f"{'x'.join(map(str, p[input_name]['min']))} to {'x'.join(map(str, p[input_name]['max']))}" for p in profiles
    )
    raise UsageError(f"input shape {'x'.join(map(str, shape))} is outside every optimization profile of the engine "
                     f"({ranges}): rebuild it with a --profile that holds it")


def check_runs_here(manifest: dict) -> Any:
    """The installed backend that runs this engine here, or a CapabilityError saying why not."""
    from enginekit.trt.backends import resolve_backend
    from enginekit.trt.builder import can_run_here

    family = "tensorrt-rtx" if manifest.get("backend") == "tensorrt-rtx" else "tensorrt"
    try:
        backend = resolve_backend(family)
    except Exception:  # noqa: BLE001 - not installed: can_run_here says so
        backend = None
    ok, reason = can_run_here(backend, manifest)
    if not ok:
        raise CapabilityError(f"the engine cannot run here: {reason}")
    return backend


_DTYPES = {"FLOAT": "float32", "HALF": "float16", "INT32": "int32", "INT64": "int64", "BOOL": "bool",
           "INT8": "int8", "UINT8": "uint8", "BF16": "bfloat16"}


def torch_dtype_name(trt_dtype: Any) -> str:
    """TensorRT's DataType -> the torch dtype's name (``DataType.HALF`` -> ``float16``)."""
    name = str(trt_dtype).rsplit(".", 1)[-1]
    if name not in _DTYPES:
        raise UsageError(f"engine tensor type {name} is not supported by the runtime")
    return _DTYPES[name]


class EngineSession:
    def __init__(self, plan: Path, manifest: dict, input_name: str, *, device: str = "cuda:0", stream=None):
        import torch

        backend = check_runs_here(manifest)
        if backend.name == "tensorrt-rtx":
            os.environ.setdefault("POLYGRAPHY_USE_TENSORRT_RTX", "1")
        trt = backend.module
        self.torch = torch
        self.device = torch.device(device)
        self.stream = stream or torch.cuda.Stream(device=self.device)
        self.logger = trt.Logger(trt.Logger.ERROR)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(Path(plan).read_bytes())
        if self.engine is None:
            raise CapabilityError(f"{backend.label} refused the plan {plan} (built for another version or GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        if inputs != [input_name]:
            raise UsageError(f"the engine's inputs are {', '.join(inputs)}; expected {input_name}")
        self.input_name = input_name
        self.output_names = tuple(n for n in names if n not in inputs)
        self.dtypes = {n: getattr(torch, torch_dtype_name(self.engine.get_tensor_dtype(n))) for n in names}
        self.input_shape = tuple(self.engine.get_tensor_shape(input_name))
        self.profiles = list(manifest.get("profiles") or [])
        if not self.profiles:
            self.profiles = [
                {input_name: dict(zip(("min", "opt", "max"), map(list, self.engine.get_tensor_profile_shape(input_name, i))))}
                for i in range(self.engine.num_optimization_profiles)
            ]
        self.max_batch = max(p[input_name]["max"][0] for p in self.profiles)
        self.profile = 0
        self._buffers: dict[tuple, dict] = {}

    def __call__(self, x) -> dict:
        torch = self.torch
        shape = tuple(x.shape)
        index = profile_for(shape, self.profiles, self.input_name)
        handle = self.stream.cuda_stream
        if index != self.profile:
            self.context.set_optimization_profile_async(index, handle)
            self.profile = index
        want = self.dtypes[self.input_name]
        x = x.to(want).contiguous() if x.dtype != want else x.contiguous()
        self.context.set_input_shape(self.input_name, shape)
        outs = self._buffers.get(shape)
        if outs is None:
            with torch.cuda.stream(self.stream):
                outs = {n: torch.empty(tuple(self.context.get_tensor_shape(n)), dtype=self.dtypes[n], device=self.device)
                        for n in self.output_names}
            self._buffers[shape] = outs
        self.context.set_tensor_address(self.input_name, x.data_ptr())
        for n, t in outs.items():
            self.context.set_tensor_address(n, t.data_ptr())
        if not self.context.execute_async_v3(handle):
            raise CapabilityError("TensorRT failed to enqueue the engine")
        return {n: (t.float() if t.dtype != torch.float32 else t) for n, t in outs.items()}
