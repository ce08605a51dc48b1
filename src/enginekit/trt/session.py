"""Which TensorRT runs an engine here (``engine_runs_here``), and running a plan with device buffers.

``engine_runs_here`` is the one answer to "which installed TensorRT runs this manifest, and can
it, on this GPU" (or, without a manifest, "would an engine built here run here"): the runtime's
backend choice, verify, bench and doctor ask it.

``EngineSession`` is the predictor's hot path: the optimization profile is chosen by the input's shape, output
buffers are allocated once per shape and reused, and work is queued on the caller's CUDA
stream (``execute_async_v3``); nothing is copied to the host here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from enginekit.errors import CapabilityError, UsageError
from enginekit.engine_file import plan_bytes
from enginekit.errors import first_line
from enginekit.trt.builder import BuiltFor, can_run_here
from enginekit.trt.flavours import TRAITS, gpu_info, resolve_flavour, resolve_targets


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


@dataclass(frozen=True)
class EngineVerdict:
    """Which installed TensorRT runs (or would run) an engine here, whether it can, and why in one line."""

    flavour: Any  # trt.flavours.Flavour, or None: no TensorRT of the engine's kind is installed
    ok: bool
    reason: str


def runs_on(traits, gpu, label: str | None = None) -> tuple[bool, str]:
    """Whether engines of one TensorRT (a ``TRAITS`` row) can run on ``gpu`` at all: a GPU, and for
    TensorRT-RTX one of its compute capabilities (it has no 9.0). Pure: doctor asks it of every row."""
    label = label or traits.label
    if gpu is None:
        return False, "this machine has no GPU"
    if traits.supports_compute_capability_targets and gpu.compute_capability not in traits.compute_capabilities:
        return False, (f"{label} does not run on compute capability {gpu.compute_capability} ({gpu.name}; "
                       f"its targets: {', '.join(traits.compute_capabilities)})")
    return True, f"runs on {gpu}"


def engine_runs_here(manifest: Mapping[str, Any] | None = None, *, flavour: str = "auto",
                     gpu: Any = "detect") -> EngineVerdict:
    """Which TensorRT runs an engine here: the one answer the runtime, verify, bench and doctor ask.

    With ``manifest``: the engine it describes (its TensorRT, version, and targets or GPU). Without:
    the engine a build with ``flavour`` (auto | tensorrt | tensorrt-rtx) would make on this machine.
    ``gpu``: this machine's (``"detect"``), or a GpuInfo (None: no GPU).
    """
    if gpu == "detect":
        gpu = gpu_info()
    if manifest is not None:
        row = TRAITS.get(str(manifest.get("backend")))
        installed = None
        if row is not None:
            try:
                installed = resolve_flavour(row.family)
            except Exception:  # noqa: BLE001 - not installed (or too old): can_run_here says so
                installed = None
        ok, reason = can_run_here(installed, manifest, gpu)
        return EngineVerdict(installed, ok, reason)
    try:
        installed = resolve_flavour(flavour)
    except (CapabilityError, UsageError) as exc:
        return EngineVerdict(None, False, ("no GPU on this machine; " if gpu is None else "") + str(exc))
    if gpu is None:
        return EngineVerdict(installed, False, f"no GPU on this machine: {installed.label} engines run only on an "
                                               "NVIDIA GPU")
    ok, reason = runs_on(installed.traits, gpu, installed.label)
    if not ok:
        return EngineVerdict(installed, False, reason)
    built = BuiltFor(installed.name, installed.version, resolve_targets(installed, None, gpu), gpu)
    ok, reason = can_run_here(installed, built, gpu)
    return EngineVerdict(installed, ok, f"{installed.label} runs on {gpu}" if ok else reason)


def installed_modules() -> dict[str, dict[str, Any]]:
    """For each TensorRT family of ``TRAITS``: does its module import, and at which version (doctor's facts)."""
    import importlib.util

    modules: dict[str, dict[str, Any]] = {}
    for row in TRAITS.values():
        if row.family in modules:
            continue
        if importlib.util.find_spec(row.module) is None:
            modules[row.family] = {"module": row.module, "version": None, "error": "not installed"}
            continue
        try:
            module = importlib.import_module(row.module)
        except Exception as exc:  # noqa: BLE001 - the wheel is there, its libraries are not
            modules[row.family] = {"module": row.module, "version": None, "error": first_line(exc, 200)}
            continue
        modules[row.family] = {"module": row.module, "version": str(getattr(module, "__version__", "0")),
                               "error": None}
    return modules


def check_runs_here(manifest: Mapping[str, Any]) -> Any:
    """The installed TensorRT flavour that runs this engine here, or a CapabilityError saying why not."""
    verdict = engine_runs_here(manifest)
    if not verdict.ok:
        raise CapabilityError(f"the engine cannot run here: {verdict.reason}")
    return verdict.flavour


_DTYPES = {"FLOAT": "float32", "HALF": "float16", "INT32": "int32", "INT64": "int64", "BOOL": "bool",
           "INT8": "int8", "UINT8": "uint8", "BF16": "bfloat16"}


def torch_dtype_name(trt_dtype: Any) -> str:
    """TensorRT's DataType -> the torch dtype's name (``DataType.HALF`` -> ``float16``)."""
    name = str(trt_dtype).rsplit(".", 1)[-1]
    if name not in _DTYPES:
        raise UsageError(f"engine tensor type {name} is not supported by the runtime")
    return _DTYPES[name]


class EngineSession:
    """An engine plan on its own CUDA stream (or the caller's): ``session(x)`` -> outputs by name."""

    def __init__(self, plan: Path, manifest: dict, input_name: str, *, device: str = "cuda:0", stream=None):
        import torch

        flavour = check_runs_here(manifest)
        if flavour.name == "tensorrt-rtx":
            os.environ.setdefault("POLYGRAPHY_USE_TENSORRT_RTX", "1")
        trt = flavour.module
        self.torch = torch
        self.device = torch.device(device)
        self.stream = stream or torch.cuda.Stream(device=self.device)
        self.logger = trt.Logger(trt.Logger.ERROR)
        self.runtime = trt.Runtime(self.logger)

        self.engine = self.runtime.deserialize_cuda_engine(plan_bytes(plan))  # after an Ultralytics header, if any
        if self.engine is None:
            raise CapabilityError(f"{flavour.label} refused the plan {plan} (built for another version or GPU?)")
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
