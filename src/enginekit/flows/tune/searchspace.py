"""The search space of one model: every backend x precision x input x batch that can run on this machine.
"""

from __future__ import annotations

import itertools
from typing import Optional

from enginekit import backends
from enginekit.errors import CapabilityError, UsageError
from enginekit.families import resolve
from enginekit.flows.tune.search import Candidate, Setting
from enginekit.gpu import check_device, gpu_info
from enginekit.precisions import names as precision_names


# -- the search space --------------------------------------------------------------------------------------
def default_backends(device: Optional[str]) -> list[str]:
    """The registered backends ``auto`` would try that run here: on a machine with a GPU those that run on it
    (TensorRT, ONNX Runtime CUDA, PyTorch), not the CPU's, which would only be timed to lose (``--backend``
    names them); on a CPU: ONNX Runtime."""
    gpu = None if device == "cpu" else gpu_info()
    found = []
    for b in backends.auto_order():
        if b.runs_on != "cpu" and gpu is None:
            continue
        if b.runs_on == "any" and gpu is None:
            continue  # PyTorch on a CPU: the reference itself, slow, and not what is deployed
        if b.runs_on == "cpu" and gpu is not None:
            continue  # a GPU is here: the CPU's backends are tens of times slower (asked for by --backend)
        if b.check(device="cuda:0" if b.runs_on != "cpu" else "cpu", gpu=gpu).ok:
            found.append(b.name)
    return found


def space(request, index: int) -> list[Candidate]:
    """The ``index``-th model's candidates (every backend x precision x input x batch that can run)."""
    name = request.models[index]
    resolve(name, request.declared)  # an unknown name: one line, before any work
    check_device(request.device)
    chosen = request.backends or default_backends(request.device)
    if not chosen:
        raise UsageError("no backend runs here: `enginekit doctor` says why")
    for backend_name in request.backends:  # asked for by name: it must run here, said before any build
        backend = backends.get(backend_name)
        verdict = backend.check(device=backend.default_device(request.device))
        if not verdict.ok:
            raise CapabilityError(f"--backend {backend_name} does not run here: {verdict.reason}")
    sizes = request.sizes(index)
    batches = request.batches or [request.frames_per_step]
    out = []
    for backend_name in chosen:
        backend = backends.get(backend_name)
        device = backend.default_device(request.device)
        on_gpu = device.startswith("cuda")
        precisions = request.precisions or (list(precision_names(exported=True)) if on_gpu else ["fp32"])
        for precision in precisions:
            if backend.precisions is not None and precision not in backend.precisions:
                continue  # ONNX Runtime and PyTorch run fp32 and fp16 of a model name
            for hw, batch in itertools.product(sizes, batches):
                out.append(Candidate((Setting(name, backend_name, precision, hw, batch, on_gpu),),
                                     request.frames_per_step))
    if not out:
        raise UsageError(f"nothing to search for {name}: no backend of {', '.join(chosen)} runs "
                         f"{', '.join(request.precisions)} (onnxruntime and torch run fp32 and fp16; tensorrt all)")
    return out
