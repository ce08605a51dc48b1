"""ONNX Runtime: an ONNX graph on the CPU, or on a GPU through the CUDA provider with I/O binding.

Sessions come from ``enginekit.onnx.runtime`` (the one place they are set up); which providers load
here is ``enginekit.backends.providers``'. bench's ``onnxruntime`` (or ``ort``) takes both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from enginekit.precisions import names as precision_names
from enginekit.backends.base import (DETECT, ONNX, Artifact, Backend, SessionInfo, Verdict, cuda_index, detect_gpu,
                                    doctor_row, static)
from enginekit.errors import CapabilityError, UsageError

_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
               "tensor(int32)": "int32", "tensor(bool)": "bool"}


def _io(sess) -> tuple[str, tuple, Any, tuple[str, ...]]:
    """A single-input session's (input name, input shape, input numpy dtype, output names)."""
    import numpy as np

    inputs = sess.get_inputs()
    if len(inputs) != 1:
        raise UsageError(f"the model has {len(inputs)} inputs; enginekit runs single-input vision models")
    i = inputs[0]
    dtype = np.dtype(_ORT_DTYPES.get(i.type, "float32")).type
    return i.name, static(i.shape), dtype, tuple(o.name for o in sess.get_outputs())


def _max_batch(shape: tuple) -> int | None:
    return shape[0] if isinstance(shape[0], int) else None


def _providers_facts() -> dict[str, Any]:
    """What doctor needs to judge both rows: providers compiled in, and whether each one loads here."""
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return {"onnxruntime_providers": None, "onnxruntime_provider_status": []}
    try:
        import onnxruntime as ort

        compiled = list(ort.get_available_providers())
    except Exception:  # noqa: BLE001 - a broken install is reported as no providers
        compiled = []
    from enginekit.backends.providers import onnxruntime_providers

    return {"onnxruntime_providers": compiled,
            "onnxruntime_provider_status": [status.to_json() for status in onnxruntime_providers()]}


class _OnnxRuntime(Backend):
    """What both ONNX Runtime backends share: they run ONNX graphs, bench's ``onnxruntime`` names both."""

    runs = (ONNX,)
    precisions = precision_names(exported=True)  # of a model name: the graphs export writes
    shorthands = ("onnxruntime", "ort")
    distributions = ("onnxruntime-gpu", "onnxruntime")

    @classmethod
    def inventory(cls, known: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if known is not None and "onnxruntime_providers" in known:
            return {}
        return _providers_facts()

    @classmethod
    def _installed(cls, inv: Mapping[str, Any]) -> tuple[str | None, list | None]:
        packages = inv["packages"]
        version = packages.get("onnxruntime-gpu") or packages.get("onnxruntime")
        providers = inv.get("onnxruntime_providers")
        return (None if providers is None else version), providers


class OnnxRuntimeCpu(_OnnxRuntime):
    """ONNX Runtime on the CPU: numpy in, numpy out. Verify runs every ONNX candidate here.

    Options: ``threads`` (intra-op threads; None: ONNX Runtime's default).
    """

    name = "onnxruntime-cpu"
    label = "ONNX Runtime on the CPU"
    runs_on = "cpu"
    needs = "onnxruntime"
    auto_rank = 3
    verifies = (ONNX,)

    @classmethod
    def check(cls, artifact: Artifact | None = None, *, device: str | None = None, gpu=DETECT,
              **options) -> Verdict:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            return Verdict(False, "onnxruntime is not installed: pip install onnxruntime-gpu")
        return Verdict(True, "ONNX Runtime on the CPU")

    def _activate(self) -> None:
        from enginekit.onnx.runtime import session

        self.session = session(self.artifact.path, threads=self.options.get("threads"))
        name, shape, dtype, outs = _io(self.session)
        self.info = SessionInfo(self.name, "cpu", name, outs, shape, dtype, _max_batch(shape))

    def infer(self, x):
        import numpy as np

        x = np.ascontiguousarray(x, dtype=self.info.input_dtype)
        values = self.session.run(list(self.info.output_names), {self.info.input_name: x})
        return dict(zip(self.info.output_names, values))

    def infer_feed(self, feed):
        from enginekit.onnx.runtime import run

        return run(self.session, dict(feed))

    def deactivate(self) -> None:
        self.session = None
        super().deactivate()

    def timed(self, batch, *, include_copies: bool = False, threads: int | None = None):
        """The session's ``run`` on numpy feeds, ``threads`` intra-op threads."""
        from enginekit.backends.timing import COPIES_NOT_APPLICABLE, Runner
        from enginekit.onnx.runtime import CPU

        run = _numpy_feeds(self.artifact.path, [CPU], batch, threads)
        return Runner(run, "cpu", COPIES_NOT_APPLICABLE, detail=f"{threads or 'default'} intra-op threads")

    @classmethod
    def doctor_rows(cls, inv: Mapping[str, Any]) -> list[dict[str, Any]]:
        from enginekit.onnx.runtime import CPU

        version, providers = cls._installed(inv)
        ok = bool(providers) and CPU in providers
        return [doctor_row(cls.name, version, None, ok,
                           "CPU provider" if ok else "onnxruntime is not installed (or does not load)")]


class OnnxRuntimeCuda(_OnnxRuntime):
    """ONNX Runtime's CUDA provider with I/O binding: inputs and outputs stay in GPU memory.

    The session computes on the predictor's own CUDA stream (``user_compute_stream``), so the
    preprocessing before it and the postprocessing after it are ordered without a host sync.
    Output buffers are kept per input shape and reused; with ``cuda_graph`` (the default) a session per
    input shape replays ORT's captured graph, at most ``MAX_GRAPHS`` of them, made at the shape's first run
    where the graph's H/W are fixed or frames come in a few shapes (``graph_per_shape``: YOLO's letterbox
    rectangles), at its second otherwise (a folder of photographs of many sizes runs the plain session).
    That session fixes the graph's named dynamic dimensions to the shape, so its shape computations fold to
    constants and every node can run on the GPU: ORT captures only a graph all on its CUDA provider. Where
    ORT refuses to capture (an NMS Loop, a node left on the CPU) the plain session runs every shape.

    With ``fuse_attention`` the session runs a copy of the graph whose attention blocks are ONNX
    Runtime's fused ``MultiHeadAttention`` (``enginekit.onnx.attention``; built once per graph into
    ``cache``); ``source_path`` stays the graph asked for, ``fused_attention`` counts the blocks fused.

    Options: ``cuda_graph`` (None: yes), ``graph_per_shape``, ``prefer_nhwc``, ``stream``, ``fuse_attention``,
    ``cache``; bench: ``threads``.
    """

    name = "onnxruntime-cuda"
    label = "ONNX Runtime CUDA"
    runs_on = "gpu"
    needs = "onnxruntime-gpu whose CUDA provider loads, and an NVIDIA GPU"
    auto_rank = 1

    @classmethod
    def check(cls, artifact: Artifact | None = None, *, device: str | None = None, gpu=DETECT,
              **options) -> Verdict:
        try:
            import onnxruntime as ort
        except ImportError:
            return Verdict(False, "onnxruntime is not installed: pip install onnxruntime-gpu")
        from enginekit.onnx.runtime import CUDA

        if CUDA not in ort.get_available_providers():
            return Verdict(False, "this onnxruntime has no CUDA provider: pip install onnxruntime-gpu")
        if detect_gpu(gpu) is None:
            return Verdict(False, "no GPU on this machine: the CUDA provider needs one")
        from enginekit.backends.providers import require_cuda_provider

        try:
            require_cuda_provider()
        except CapabilityError as exc:
            return Verdict(False, str(exc))
        return Verdict(True, "ONNX Runtime's CUDA provider loads")

    def _activate(self) -> None:
        import torch

        from enginekit.backends.providers import require_cuda_provider

        self.ort = require_cuda_provider()
        self.source_path = self.path = Path(self.artifact.path)
        self.fused_attention = 0
        if self.options.get("fuse_attention"):
            self.path, self.fused_attention = _fused_graph(self.path, self.options.get("cache"))
        self.index = cuda_index(self.device)
        self.stream = self.options.get("stream") or torch.cuda.Stream(device=self.index)
        cuda_graph = self.options.get("cuda_graph")
        self.cuda_graph = cuda_graph
        self.prefer_nhwc = self.options.get("prefer_nhwc")
        self._buffers: dict[tuple, dict] = {}
        self.session = self._make_session(graph=False)  # runs every shape; learns output shapes
        name, shape, dtype, outs = _io(self.session)
        self.info = SessionInfo(self.name, f"cuda:{self.index}", name, outs, shape, dtype, _max_batch(shape))
        self._dim_names = tuple(self.session.get_inputs()[0].shape)  # a name (str) where a dimension is dynamic
        if cuda_graph is None:
            self.cuda_graph = True
        # a shape's graph session at its first run where shapes are few (fixed H/W: one per batch size; YOLO's
        # letterbox rectangles: one per aspect), at its second otherwise
        few = self.info.fixed_hw is not None or bool(self.options.get("graph_per_shape"))
        self.graph_at = 1 if few else 2
        self.run_options = self.ort.RunOptions()
        # ordering on our stream is enough: no device-wide sync at the end of each run
        self.run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")

    #: ONNX Runtime's CUDA provider captures a session's graph on the third run on a thread (two regular runs
    #: first: ``min_num_runs_before_cuda_graph_capture_``) and keeps it in that thread's context; its capture
    #: is cudaStreamCaptureModeGlobal, which any other thread's CUDA call meanwhile spoils
    GRAPH_CAPTURE_RUNS = 3
    #: graph sessions kept (one per input shape; each holds its own copy of the weights)
    MAX_GRAPHS = 8

    @property
    def capture_runs(self) -> int:
        """Runs of one shape after which its graph is captured (a stream warms up with them)."""
        return self.graph_at - 1 + self.GRAPH_CAPTURE_RUNS if self.cuda_graph else 0

    @property
    def graphs(self) -> int:
        """Input shapes whose graph session has run as often as ORT needs to capture (so far)."""
        return sum(1 for state in self._buffers.values() if state.get("graph_runs", 0) >= self.GRAPH_CAPTURE_RUNS)

    def fixed_dims(self, shape: tuple) -> dict[str, int]:
        """The graph's named dynamic input dimensions fixed to ``shape`` (none where one name takes two sizes)."""
        dims: dict[str, int] = {}
        for name, size in zip(self._dim_names, shape):
            if isinstance(name, str):
                if dims.setdefault(name, int(size)) != int(size):
                    return {}
        return dims

    def _make_session(self, *, graph: bool, dims: dict[str, int] | None = None):
        from enginekit.onnx.runtime import CPU, CUDA, session

        options = {"device_id": str(self.index), "user_compute_stream": str(self.stream.cuda_stream),
                   "enable_cuda_graph": "1" if graph else "0"}
        if self.prefer_nhwc is not None:
            options["prefer_nhwc"] = "1" if self.prefer_nhwc else "0"
        sess = session(self.path, providers=[(CUDA, options), CPU], dims=dims)
        if CUDA not in sess.get_providers():
            raise CapabilityError("ONNX Runtime could not start its CUDA provider on this GPU")
        return sess

    def _bind(self, sess, x, outs):
        binding = sess.io_binding()
        binding.bind_input(self.info.input_name, "cuda", self.index, self.info.input_dtype, tuple(x.shape),
                           x.data_ptr())
        for name, t in outs.items():
            binding.bind_output(name, "cuda", self.index, _np_dtype(t.dtype), tuple(t.shape), t.data_ptr())
        return binding

    def _prepare(self, x) -> dict:
        """One input shape's output buffers (the plain session's run, to learn their shapes)."""
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
        state = self._buffers[shape] = {"outs": outs, "runs": 0}
        return state

    def _graph_session(self, state: dict, x, *, on_input: bool = False) -> None:
        """The shape's session that captures its graph: fixed input and output addresses (ORT captures on a
        later run, ``capture_runs``), the graph's dynamic dimensions fixed to the shape. ``on_input``: the graph
        reads ``x`` itself (``infer_fixed``), else a buffer of its own that each run copies its input into."""
        import torch

        try:
            sess = self._make_session(graph=True, dims=self.fixed_dims(tuple(x.shape)))
        except Exception:  # noqa: BLE001 - ORT refuses graph capture for control flow (an NMS Loop)
            self.cuda_graph = False
            return
        if on_input:
            inp = x
        else:
            with torch.cuda.stream(self.stream), torch.inference_mode(False):
                inp = torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
        state.update(inp=inp, session=sess, binding=self._bind(sess, inp, state["outs"]))

    def infer(self, x):
        """``x``: a contiguous CUDA tensor, written on ``self.stream`` (or before it)."""
        return self._infer(x, fixed=False)

    def infer_fixed(self, x):
        """A shape's graph session bound to ``x`` itself where ``x`` is the input it is made with (no copy at each
        run); any other tensor of that shape is copied into it, as ``infer`` does."""
        return self._infer(x, fixed=True)

    def _infer(self, x, *, fixed: bool):
        state = self._buffers.get(tuple(x.shape)) or self._prepare(x)
        state["runs"] += 1
        if (self.cuda_graph and "session" not in state and state["runs"] >= self.graph_at
                and sum("session" in s for s in self._buffers.values()) < self.MAX_GRAPHS):
            self._graph_session(state, x, on_input=fixed)
        if self.cuda_graph and "session" in state:
            if state["inp"] is not x:
                state["inp"].copy_(x)
            try:
                state["session"].run_with_iobinding(state["binding"], self.run_options)
            except Exception:  # noqa: BLE001 - ORT refuses graph capture when a node runs on the CPU
                if state.get("graph_runs"):
                    raise
                self.cuda_graph = False  # every shape runs the plain session
                for s in self._buffers.values():
                    for key in ("inp", "session", "binding"):
                        s.pop(key, None)
            else:
                state["graph_runs"] = state.get("graph_runs", 0) + 1
                return state["outs"]
        self.session.run_with_iobinding(self._bind(self.session, x, state["outs"]), self.run_options)
        return state["outs"]

    def timed(self, batch, *, include_copies: bool = False, threads: int | None = None):
        """numpy feeds on the CUDA provider (no I/O binding): every run copies the input in and outputs out."""
        from enginekit.backends.timing import COPIES_INCLUDED, Runner
        from enginekit.gpu import gpu_info
        from enginekit.onnx.runtime import CPU, CUDA

        run = _numpy_feeds(self.artifact.path, [CUDA, CPU], batch, threads)
        return Runner(run, str(gpu_info() or "cuda"), COPIES_INCLUDED, detail="numpy feeds (no I/O binding)")

    @classmethod
    def doctor_rows(cls, inv: Mapping[str, Any]) -> list[dict[str, Any]]:
        from enginekit.onnx.runtime import CUDA

        version, providers = cls._installed(inv)
        has_cuda = bool(providers) and CUDA in providers
        status = {s["name"]: s for s in inv.get("onnxruntime_provider_status") or []}.get(CUDA)
        loads = status is None or status["loads"] is not False  # not checked (older inventories): trust the list
        if not has_cuda:
            reason = "no CUDA provider: pip install onnxruntime-gpu"
        elif not loads:
            reason = f"CUDA provider compiled in but it does not load: {status['detail']}"
        elif inv.get("gpu") is None:
            detail = f" ({status['detail']})" if status else ""
            reason = f"CUDA provider installed, but this machine has no GPU{detail}"
        else:
            reason = f"CUDA provider on {inv['gpu']['name']}"
        return [doctor_row(cls.name, version, None, has_cuda and loads and inv.get("gpu") is not None, reason)]


def _numpy_feeds(path: Path, providers: list, batch, threads: int | None):
    """``run()``: one ``session.run`` of ``batch`` over ``path``, whose session must run on ``providers[0]``."""
    from enginekit.onnx.runtime import session

    sess = session(path, providers=providers, threads=threads)
    if sess.get_providers()[0] != providers[0]:
        raise CapabilityError(f"ONNX Runtime did not load {providers[0]} (it fell back to {sess.get_providers()[0]})")
    feeds = {sess.get_inputs()[0].name: batch}

    def run():
        sess.run(None, feeds)

    return run


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


def _torch_dtype(ort_type: str):
    import torch

    return {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(int64)": torch.int64,
            "tensor(int32)": torch.int32, "tensor(bool)": torch.bool}.get(ort_type, torch.float32)


def _np_dtype(torch_dtype):
    import numpy as np
    import torch

    return {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32,
            torch.bool: np.bool_}[torch_dtype]
