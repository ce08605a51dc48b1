"""Backends as small lazy loaders: each turns a model file (or module) into a session.

A session takes a batch (numpy on the CPU, a torch tensor on the GPU) and returns its outputs
by name, of the same kind. Nothing here imports onnxruntime, torch or tensorrt until a
session is made; TensorRT itself is only touched through ``enginekit.trt``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enginekit.errors import CapabilityError, UsageError

BACKENDS = ("auto", "tensorrt", "onnxruntime-cuda", "onnxruntime-cpu", "torch")
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
               "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


@dataclass
class SessionInfo:
    """What pre- and postprocessing need to know about a session."""

    backend: str
    device: str  # "cpu" or "cuda:N"
    input_name: str
    output_names: tuple[str, ...]
    input_shape: tuple  # ints, or None where dynamic
    input_dtype: Any = np.float32
    max_batch: int | None = None
    #: per profile: {"min": [...], "max": [...]} of the input (TensorRT); empty: any shape
    profiles: list[dict] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def fixed_hw(self) -> tuple[int, int] | None:
        h, w = self.input_shape[2], self.input_shape[3]
        return (h, w) if isinstance(h, int) and isinstance(w, int) else None


def _static(dims) -> tuple:
    return tuple(d if isinstance(d, int) and d > 0 else None for d in dims)


def _cuda_index(device: str) -> int:
    return int(device.split(":")[1]) if ":" in device else 0


# -- ONNX Runtime ----------------------------------------------------------------------------------
def _session_options(ort, threads: int | None = None):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    return opts


def _io(sess) -> tuple[str, tuple, Any, tuple[str, ...]]:
    inputs = sess.get_inputs()
    if len(inputs) != 1:
        raise UsageError(f"the model has {len(inputs)} inputs; enginekit runs single-input vision models")
    i = inputs[0]
    return i.name, _static(i.shape), _ORT_DTYPES.get(i.type, np.float32), tuple(o.name for o in sess.get_outputs())


def _max_batch(shape: tuple) -> int | None:
    return shape[0] if isinstance(shape[0], int) else None


class OrtCpuSession:
    """ONNX Runtime on the CPU: numpy in, numpy out."""

    def __init__(self, path: Path, threads: int | None = None):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), sess_options=_session_options(ort, threads),
                                            providers=["CPUExecutionProvider"])
        name, shape, dtype, outs = _io(self.session)
        self.info = SessionInfo("onnxruntime-cpu", "cpu", name, outs, shape, dtype, _max_batch(shape))

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        x = np.ascontiguousarray(x, dtype=self.info.input_dtype)
        values = self.session.run(list(self.info.output_names), {self.info.input_name: x})
        return dict(zip(self.info.output_names, values))


class OrtCudaSession:
    """ONNX Runtime's CUDA provider with I/O binding: inputs and outputs stay in GPU memory.

    The session computes on the predictor's own CUDA stream (``user_compute_stream``), so the
    preprocessing before it and the postprocessing after it are ordered without a host sync.
    Output buffers are kept per input shape and reused; with ``cuda_graph`` one session per
    input shape replays ORT's captured graph.

    With ``fuse_attention`` the session runs a copy of the graph whose attention blocks are ONNX
    Runtime's fused ``MultiHeadAttention`` (``enginekit.onnx.attention``; built once per graph into
    ``cache``); ``source_path`` stays the graph asked for, ``fused_attention`` counts the blocks fused.
    """

    def __init__(self, path: Path, device: str = "cuda:0", *, cuda_graph: bool | None = None,
                 prefer_nhwc: bool | None = None, stream=None, fuse_attention: bool = False, cache=None):
        import torch

        from enginekit.runtime.providers import require_cuda_provider

        self.ort = require_cuda_provider()
        self.source_path = self.path = Path(path)
        self.fused_attention = 0
        if fuse_attention:
            self.path, self.fused_attention = _fused_graph(self.path, cache)
        self.index = _cuda_index(device)
        self.stream = stream or torch.cuda.Stream(device=self.index)
        self.cuda_graph = cuda_graph
        self.prefer_nhwc = prefer_nhwc
        self._graph_sessions: dict[tuple, Any] = {}
        self._buffers: dict[tuple, dict] = {}
        self.session = self._make_session(graph=False)  # runs every shape; learns output shapes
        name, shape, dtype, outs = _io(self.session)
        self.info = SessionInfo("onnxruntime-cuda", f"cuda:{self.index}", name, outs, shape, dtype, _max_batch(shape))
        if cuda_graph is None:  # default: replay a captured graph where H/W are fixed (one graph per batch size)
            self.cuda_graph = self.info.fixed_hw is not None
        self.run_options = self.ort.RunOptions()
        # ordering on our stream is enough: no device-wide sync at the end of each run
        self.run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")

    def _make_session(self, *, graph: bool):
        ort = self.ort
        options = {"device_id": str(self.index), "user_compute_stream": str(self.stream.cuda_stream),
                   "enable_cuda_graph": "1" if graph else "0"}
        if self.prefer_nhwc is not None:
            options["prefer_nhwc"] = "1" if self.prefer_nhwc else "0"
        sess = ort.InferenceSession(str(self.path), sess_options=_session_options(ort),
                                    providers=[("CUDAExecutionProvider", options), "CPUExecutionProvider"])
        if "CUDAExecutionProvider" not in sess.get_providers():
            raise CapabilityError("ONNX Runtime could not start its CUDA provider on this GPU")
        return sess

    def _bind(self, sess, x, outs):
        binding = sess.io_binding()
        binding.bind_input(self.info.input_name, "cuda", self.index, self.info.input_dtype, tuple(x.shape), x.data_ptr())
        for name, t in outs.items():
            binding.bind_output(name, "cuda", self.index, _np_dtype(t.dtype), tuple(t.shape), t.data_ptr())
        return binding

    def _prepare(self, x) -> dict:
        """Output buffers (and, with a CUDA graph, the input buffer and its session) for one input shape."""
        import torch

        shape = tuple(x.shape)
        binding = self.session.io_binding()
        binding.bind_input(self.info.input_name, "cuda", self.index, self.info.input_dtype, shape, x.data_ptr())
        for name in self.info.output_names:
            binding.bind_output(name, "cuda", self.index)
        self.session.run_with_iobinding(binding)  # ORT's own allocations, to learn the output shapes
        values = binding.get_outputs()
        with torch.cuda.stream(self.stream), torch.inference_mode(False):  # updated in place later
            outs = {n: torch.empty(tuple(v.shape()), dtype=_torch_dtype(v.data_type()), device=x.device)
                    for n, v in zip(self.info.output_names, values)}
            state = {"outs": outs}
            if self.cuda_graph:  # fixed addresses: ORT captures its graph on the first run of this session
                try:
                    sess = self._make_session(graph=True)
                except Exception:  # noqa: BLE001 - ORT refuses graph capture for control flow (an NMS Loop)
                    self.cuda_graph = False
                else:
                    inp = torch.empty(shape, dtype=x.dtype, device=x.device)
                    state.update(inp=inp, session=sess, binding=self._bind(sess, inp, outs))
        self._buffers[shape] = state
        return state

    def __call__(self, x):
        """``x``: a contiguous CUDA tensor, written on ``self.stream`` (or before it)."""
        state = self._buffers.get(tuple(x.shape)) or self._prepare(x)
        if self.cuda_graph:
            state["inp"].copy_(x)
            try:
                state["session"].run_with_iobinding(state["binding"], self.run_options)
            except Exception:  # noqa: BLE001 - ORT refuses graph capture when a node runs on the CPU
                if state.get("ran"):
                    raise
                self.cuda_graph = False
                self._buffers.clear()
                return self(x)
            state["ran"] = True
        else:
            self.session.run_with_iobinding(self._bind(self.session, x, state["outs"]), self.run_options)
        return state["outs"]


def _fused_graph(path: Path, cache) -> tuple[Path, int]:
    """``path``'s copy with fused attention, or ``path`` itself where nothing fuses or the rewrite fails."""
    from enginekit import reporting
    from enginekit.errors import first_line
    from enginekit.onnx.attention import fused_attention_copy

    try:
        fused, count = fused_attention_copy(path, cache)
    except UsageError:  # the cache's location: the user's to fix
        raise
    except Exception as exc:  # noqa: BLE001 - the plain graph still runs
        reporting.warning(f"attention fusion of {path.name} failed, running the graph as it is: "
                          f"{first_line(exc, 160)}")
        return path, 0
    return (fused, count) if fused is not None else (path, 0)


#: one CUDA-graph capture at a time in this process, and failed graphs kept: a predictor pipeline runs
#: its models on threads, and torch aborts the process when it frees a graph whose capture failed
_CAPTURE_LOCK = __import__("threading").Lock()
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


def _torch_dtype(ort_type: str):
    import torch

    return {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(int64)": torch.int64,
            "tensor(int32)": torch.int32, "tensor(bool)": torch.bool}.get(ort_type, torch.float32)


def _np_dtype(torch_dtype):
    import torch

    return {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32,
            torch.bool: np.bool_}[torch_dtype]


# -- PyTorch -----------------------------------------------------------------------------------------
class TorchSession:
    """The PyTorch module itself. On a GPU: FP16 when asked, and a CUDA graph per input shape."""

    def __init__(self, module, output_names: tuple[str, ...], input_name: str, input_shape: tuple,
                 device: str = "cpu", *, half: bool = False, cuda_graph: bool | None = None, stream=None):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.half = half and self.device.type == "cuda"
        self.module = module.to(self.device).eval()
        # YOLO heads rebuild their anchors from CPU aranges when ``dynamic``: a host copy a CUDA graph
        # cannot capture. Not dynamic, they are built once per input shape, in the warm-up before capture.
        self._heads = [m for m in self.module.modules() if hasattr(m, "anchors") and hasattr(m, "dynamic")]
        for m in self._heads:
            m.dynamic = False
        if self.half:
            self.module = self.module.half()
        on_gpu = self.device.type == "cuda"
        self.cuda_graph = on_gpu if cuda_graph is None else (cuda_graph and on_gpu)
        self.stream = (stream or torch.cuda.Stream(device=self.device)) if on_gpu else None
        self._graphs: dict[tuple, tuple] = {}
        self._keep: list = []
        self.info = SessionInfo("torch", str(self.device) if on_gpu else "cpu", input_name, output_names,
                                _static(input_shape), np.float32, None)

    def _forward(self, x):
        out = self.module(x.half() if self.half else x)
        if not isinstance(out, (tuple, list)):
            out = (out,)
        return {n: o.float() for n, o in zip(self.info.output_names, out)}

    def __call__(self, x):
        torch = self.torch
        with torch.inference_mode():
            if isinstance(x, np.ndarray):
                x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)
                return {k: v.cpu().numpy() for k, v in self._forward(x).items()}
            if not self.cuda_graph:
                return self._forward(x)
            shape = tuple(x.shape)
            if shape not in self._graphs:
                try:
                    self._graphs[shape] = self._capture(x)
                except RuntimeError:  # a module that copies from the host in its forward (RT-DETR's anchors)
                    self._graphs[shape] = None
            if self._graphs[shape] is None:  # runs as it is, kernel by kernel
                return self._forward(x)
            graph, static_in, static_out = self._graphs[shape]
            static_in.copy_(x)
            graph.replay()
            return static_out

    def _capture(self, x):
        static_in = x.clone()
        for _ in range(2):  # more warm-up: cuDNN picks its algorithms outside the capture
            self._forward(static_in)
        graph, static_out = capture_graph(lambda: self._forward(static_in), self.device)
        self._keep.append([(m.anchors, m.strides) for m in self._heads])  # the graph reads these addresses
        return graph, static_in, static_out


# -- TensorRT ---------------------------------------------------------------------------------------
class TensorRTSession:
    """A cached engine plan through ``enginekit.trt.session`` (the only code importing TensorRT)."""

    def __init__(self, plan: Path, manifest: dict, input_name: str, device: str = "cuda:0", stream=None):
        from enginekit.trt.session import EngineSession

        self.engine = EngineSession(plan, manifest, input_name, device=device, stream=stream)
        self.stream = self.engine.stream
        self.info = SessionInfo("tensorrt", device, input_name, self.engine.output_names, _static(self.engine.input_shape),
                                np.float32, self.engine.max_batch, self.engine.profiles)

    def __call__(self, x):
        return self.engine(x)
