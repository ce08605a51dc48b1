"""PyTorch: the module itself, loaded by its family (this backend gets it already loaded).

On a GPU it runs FP16 when asked and replays a CUDA graph per input shape, of a channels-last copy of the module whose
fused convolution blocks add their bias and apply SiLU in one kernel (``conv_epilogue``); on the CPU, eager FP32.
bench times it three ways: FP32, FP16, and FP16 replayed from a CUDA graph.
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any, Mapping

from enginekit.precisions import names as precision_names
from enginekit.backends.base import (DETECT, KIND_WORDS, MODULE, ONNX, Artifact, Backend, SessionInfo, Verdict,
                                    doctor_row, static)

#: one CUDA-graph capture at a time in this process, and failed graphs kept: a predictor pipeline runs
#: its models on threads, and torch aborts the process when it frees a graph whose capture failed
_CAPTURE_LOCK = threading.Lock()
_FAILED_GRAPHS: list = []


def capture_graph(fn, device):
    """``fn()`` captured as a CUDA graph on ``device`` (after one warm-up run on a side stream):
    ``(graph, outputs)``. Work other threads queue meanwhile does not spoil the capture
    (``thread_local`` mode). Raises RuntimeError where ``fn`` cannot be captured."""
    import torch

    with _CAPTURE_LOCK:
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the capture: kernels chosen, memory allocated
            fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = fn()
        except Exception:
            _FAILED_GRAPHS.append(graph)
            raise
    return graph, out


def _torch_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


class Torch(Backend):
    """The PyTorch module itself. On a GPU: FP16 when asked, and a CUDA graph per input shape.

    Options: ``precision`` ("fp16": half precision on a GPU), ``cuda_graph`` (None: on a GPU),
    ``stream`` (a torch.cuda.Stream to queue the work on).
    """

    name = "torch"
    label = "PyTorch"
    runs = (MODULE,)
    runs_on = "any"
    needs = "torch; a CUDA GPU for FP16 and CUDA graphs"
    precisions = precision_names(exported=True)
    auto_rank = 2
    distributions = ("torch",)

    @classmethod
    def variants(cls) -> dict[str, dict[str, Any]]:
        return {"torch-fp32": {"precision": "fp32", "cuda_graph": False},
                "torch-fp16": {"precision": "fp16", "cuda_graph": False},
                "torch-fp16-cudagraph": {"precision": "fp16", "cuda_graph": True}}

    @classmethod
    def check(cls, artifact: Artifact | None = None, *, device: str | None = None, gpu=DETECT,
              precision: str = "fp32", cuda_graph: bool | None = None, **options) -> Verdict:
        """FP32 runs wherever torch is; FP16, CUDA graphs and a cuda device need torch to see a GPU."""
        if importlib.util.find_spec("torch") is None:
            return Verdict(False, "torch is not installed")
        if not ((device or "").startswith("cuda") or precision != "fp32" or cuda_graph):
            return Verdict(True, "eager PyTorch on the CPU")
        if _torch_cuda():
            return Verdict(True, "PyTorch on the GPU")
        if cuda_graph:
            return Verdict(False, "CUDA graphs need a CUDA GPU; torch sees none")
        if precision != "fp32":
            return Verdict(False, f"{precision.upper()} needs a CUDA GPU; torch sees none (CPU {precision.upper()} "
                                  "says nothing about deployment)")
        return Verdict(False, "torch sees no CUDA GPU")

    @classmethod
    def refuses(cls, target) -> str | None:
        """A model name; or an ONNX file of seeded random weights, whose module is made again."""
        random = target.metadata.get("weights", "").startswith("random:")
        if target.kind == "model" or (target.kind == ONNX and target.model and random):
            return None
        return f"{target.label} is {KIND_WORDS[target.kind]}: the {cls.name} backend needs a model name (and --weights)"

    # -- the runner ---------------------------------------------------------------------------------
    def _activate(self) -> None:
        import numpy as np
        import torch

        a = self.artifact
        self.torch = torch
        self.torch_device = torch.device(self.device)
        on_gpu = self.torch_device.type == "cuda"
        self.half = self.options.get("precision") == "fp16" and on_gpu
        self.module = a.module.to(self.torch_device).eval()
        # YOLO heads rebuild their anchors from CPU aranges when ``dynamic``: a host copy a CUDA graph
        # cannot capture. Not dynamic, they are built once per input shape, in the warm-up before capture.
        self._heads = [m for m in self.module.modules() if hasattr(m, "anchors") and hasattr(m, "dynamic")]
        for m in self._heads:
            m.dynamic = False
        if self.half:
            self.module = self.module.half()
        cuda_graph = self.options.get("cuda_graph")
        self.cuda_graph = on_gpu if cuda_graph is None else (cuda_graph and on_gpu)
        # replayed from CUDA graphs, a copy of the module in channels-last layout with its convolution blocks' bias
        # and SiLU fused (``conv_epilogue``) runs instead; the module given stays as it is (export traces it), on the
        # CPU meanwhile (its weights not twice on the GPU), until the copy would not run (``_fall_back``)
        self._plain, self._fast = self.module, None
        if self.cuda_graph:
            self._fast = _fast_module(self.module)
            if self._fast is not None:
                self.module = self._fast
                self._plain.to("cpu")
        self.stream = (self.options.get("stream") or torch.cuda.Stream(device=self.torch_device)) if on_gpu else None
        self._graphs: dict[tuple, tuple] = {}
        self._keep: list = []
        self.info = SessionInfo(self.name, str(self.torch_device) if on_gpu else "cpu", a.input_name, a.output_names,
                                static(a.input_shape), np.float32, None)

    def _forward(self, x):
        torch = self.torch
        out = self.module(x.half() if self.half else x)
        if not isinstance(out, (tuple, list)):
            out = (out,)
        # float32 in the usual layout whatever the module's own (a channels-last copy's masks' prototypes)
        return {n: o.to(torch.float32, memory_format=torch.contiguous_format)
                for n, o in zip(self.info.output_names, out)}

    def infer(self, x):
        return self._infer(x, fixed=False)

    def infer_fixed(self, x):
        """A shape's graph captured on ``x`` itself where ``x`` is its first input (no copy into a buffer of the
        graph's own at each call); any other tensor of that shape is copied in, as ``infer`` does."""
        return self._infer(x, fixed=True)

    def forward_in_graph(self, x):
        """The module on ``x`` where a graph of its shape was captured here already (so its forward makes no host copy
        and no wait; the module as it runs then, fast copy or as given), for a caller's graph to capture."""
        if not self.cuda_graph or not self._graphs.get(tuple(x.shape)):
            return None
        module, forward = self.module, self._forward

        def run():
            return forward(x)

        # what the caller's graph reads stays with it (a later fall-back to the module as given drops the copy here)
        run.keeps = (module, [(m.anchors, m.strides) for m in module.modules() if hasattr(m, "anchors")])
        return run

    def _infer(self, x, *, fixed: bool):
        import numpy as np

        torch = self.torch
        if not torch.is_inference_mode_enabled():
            with torch.inference_mode():
                return self._infer(x, fixed=fixed)
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.torch_device)
            return {k: v.cpu().numpy() for k, v in self._forward(x).items()}
        if not self.cuda_graph:
            return self._forward(x)
        shape = x.shape
        entry = self._graphs.get(shape, False)
        if entry is False:
            try:
                entry = self._graphs[shape] = self._capture(x, on_input=fixed)
            except RuntimeError:  # a module that copies from the host in its forward (RT-DETR's anchors)
                entry = self._graphs[shape] = None
        if entry is None:  # runs as it is, kernel by kernel
            return self._forward(x)
        graph, static_in, static_out = entry
        if static_in is not x:
            static_in.copy_(x)
        graph.replay()
        return static_out

    def _capture(self, x, *, on_input: bool = False):
        static_in = x if on_input else x.clone()
        try:
            return self._capture_on(static_in)
        except Exception:  # noqa: BLE001 - the fast copy would not run or capture (a module of its own): as given
            if self.module is self._plain:
                raise
            self._fall_back()
            return self._capture_on(static_in)

    def _capture_on(self, static_in):
        for _ in range(2):  # more warm-up: cuDNN picks its algorithms outside the capture
            self._forward(static_in)
        graph, static_out = capture_graph(lambda: self._forward(static_in), self.torch_device)
        heads = [m for m in self.module.modules() if hasattr(m, "anchors") and hasattr(m, "dynamic")]
        self._keep.append([(m.anchors, m.strides) for m in heads])  # the graph reads these addresses
        return graph, static_in, static_out

    def _fall_back(self) -> None:
        """The module as given from now on (in its own layout, its blocks as they are), for every input shape."""
        self.module, self._fast = self._plain.to(self.torch_device), None
        self._graphs.clear()
        self._keep.clear()

    # -- bench ----------------------------------------------------------------------------------------
    def timed(self, batch, *, include_copies: bool = False, threads: int | None = None):
        """Eager PyTorch (FP32 on CPU or GPU; FP16 on GPU), or FP16 replayed from a CUDA graph.

        A copy of the module is timed (the one given stays as export needs it), fed one shape.
        """
        import copy

        import torch

        from enginekit.backends.timing import COPIES_EXCLUDED, COPIES_INCLUDED, COPIES_NOT_APPLICABLE, Runner

        half = self.options.get("precision") == "fp16"
        cuda_graph = bool(self.options.get("cuda_graph"))
        model = _fixed_shape(copy.deepcopy(self.artifact.module))
        if not half and not cuda_graph and not torch.cuda.is_available():
            if threads is not None:
                torch.set_num_threads(threads)
            x = torch.from_numpy(batch)

            def run_cpu():
                with torch.inference_mode():
                    model(x)

            return Runner(run_cpu, "cpu", COPIES_NOT_APPLICABLE, detail=f"{torch.get_num_threads()} intra-op threads")
        dtype = torch.float16 if half else torch.float32
        model = model.to("cuda", dtype)
        host = torch.from_numpy(batch)
        x = host.to("cuda", dtype)
        device = torch.cuda.get_device_name()
        copies = COPIES_INCLUDED if include_copies else COPIES_EXCLUDED
        if cuda_graph:
            return _cuda_graph_runner(model, x, host, include_copies, device, copies)

        def run_gpu():
            with torch.inference_mode():
                out = model(host.to("cuda", dtype, non_blocking=False) if include_copies else x)
                if include_copies:
                    _to_host(out)

        return Runner(run_gpu, device, copies, close=lambda: _free_cuda(model))

    # -- doctor -------------------------------------------------------------------------------------
    @classmethod
    def inventory(cls, known: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {"torch_cuda": _torch_cuda_version()}

    @classmethod
    def doctor_rows(cls, inv: Mapping[str, Any]) -> list[dict[str, Any]]:
        """torch-cpu and torch-cuda: installed, a CUDA build, a GPU."""
        version = inv["packages"].get(cls.distributions[0])
        gpu, cuda = inv.get("gpu"), inv.get("torch_cuda")
        cpu_reason = "eager PyTorch on the CPU" if version else "torch is not installed"
        cpu = doctor_row(f"{cls.name}-cpu", version, None, version is not None, cpu_reason)
        if version is None:
            reason = "torch is not installed"
        elif cuda is None:
            reason = "torch is a CPU-only build"
        elif gpu is None:
            reason = f"torch is built for CUDA {cuda}, but this machine has no GPU"
        else:
            reason = f"torch CUDA {cuda} on {gpu['name']}"
        return [cpu, doctor_row(f"{cls.name}-cuda", version, None, bool(version and cuda and gpu), reason)]


def _fast_module(module):
    """A copy of ``module`` (on its GPU) in channels-last layout with its fused convolution blocks' bias and SiLU as
    one kernel each (``conv_epilogue.fuse_blocks``): cuDNN's convolutions in that layout with no layout changes
    between them, and about a third fewer kernels in a YOLO's graph. None where the copy cannot be made."""
    import copy

    import torch

    from enginekit import conv_epilogue

    try:
        fast = copy.deepcopy(module).to(memory_format=torch.channels_last)
    except Exception:  # noqa: BLE001 - a module that cannot be copied: it runs as given
        return None
    conv_epilogue.fuse_blocks(fast)
    for pool in (m for m in fast.modules() if type(m) is torch.nn.MaxPool2d):
        pool.forward = _pooled_in_nchw(pool)
    return fast


def _pooled_in_nchw(pool):
    """``pool``'s forward on its input in the usual layout, its output channels-last again: torch's channels-last max
    pooling is the slower on a GPU (5x5 on 1x256x20x20 FP16, a YOLOv8s's SPPF at 640, on an H200: 45.6 us against
    14.9 in the usual layout; the two copies around it are of that small tensor)."""
    import torch
    import torch.nn.functional as F

    def forward(x):
        y = F.max_pool2d(x.contiguous(), pool.kernel_size, pool.stride, pool.padding, pool.dilation,
                         ceil_mode=pool.ceil_mode, return_indices=pool.return_indices)
        return y.contiguous(memory_format=torch.channels_last) if x.dim() == 4 and not pool.return_indices else y

    return forward


def _torch_cuda_version() -> str | None:
    """The CUDA version torch was built for, read from torch/version.py without importing torch."""
    import re
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    try:
        match = re.search(r"^cuda(?:: \S+)? = '([^']+)'", version_file.read_text(), re.MULTILINE)
    except OSError:
        return None
    return match.group(1) if match else None


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


def _cuda_graph_runner(model, x, host, include_copies: bool, device: str, copies: str):
    """Capture one forward in a CUDA graph (static input buffer), then replay it."""
    import torch

    from enginekit.backends.timing import Runner

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
