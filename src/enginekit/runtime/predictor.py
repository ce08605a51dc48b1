"""A predictor: images in (paths, numpy HWC, torch CUDA tensors), results out, on one backend."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from enginekit.errors import UsageError
from enginekit.backends.pytorch import capture_graph
from enginekit.families.registry import registered
from enginekit.fsutil import refuse_special_file
from enginekit.images import read_bgr
from enginekit.runtime.pinned import on_device as decoded_on_device, pinned_tensor, token, uploaded
from enginekit.runtime.step_graph import STEP_GRAPHS, capture_step, shares_memory
from enginekit.runtime.stream import Stream


def processor_for(adapter):
    """The pre/postprocessing class ``adapter``'s family declares (``families.interface.Runtime.processor``)."""
    if adapter.processor is None:
        known = sorted({c.family for c in registered() if c.processor is not None})
        raise UsageError(f"enginekit does not run {adapter.family} models yet (the runtime knows {', '.join(known)})")
    return adapter.processor


def read_image(path) -> np.ndarray:
    """BGR uint8 HxWx3, as OpenCV reads it; UsageError for a missing, unreadable or truncated file."""
    p = Path(path)
    refuse_special_file(p, "image")
    if not p.is_file():
        raise UsageError(f"image not found: {p}")
    img, problem = read_bgr(p)
    if img is None:
        raise UsageError(f"not a readable image: {p}" + (f" ({problem})" if problem != "not a readable image" else ""))
    return img


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


@dataclass
class GpuBatch:
    """A batch queued on a predictor's CUDA stream (``Predictor.submit_gpu``), waiting to be postprocessed."""

    shapes: list  # the frames' H x W
    hw: tuple  # the network's
    outputs: dict
    events: list  # recorded on ``stream``: start, preprocessed, inferred
    stream: Any
    kept: bool  # outputs copied out of the session's buffers
    host_ms: float = 0.0  # preprocessing on the host before the upload (Ultralytics' letterbox)
    step: Any = None  # the step's own graph where it replayed one (``step_graph``): its events, outputs, decode


@dataclass
class PreGraph:
    """The preprocessing of one frame shape captured as a CUDA graph: it reads ``static_in`` (each call's frames
    are copied in first, or were ahead: ``bound``) and writes ``static_out``."""

    static_in: list
    graph: Any
    static_out: Any
    bindable: bool = True  # ``static_out`` is not a view of ``static_in``
    read_done: Any = None  # the event after its last replay (on the predictor's stream): ``static_in`` is free
    bound: Any = None  # ``pinned.token`` of the frames ``Predictor.bind_ahead`` copied into ``static_in``, or None


#: queued-decode CUDA graphs a predictor keeps (one per output shapes and frame sizes)
POST_GRAPHS = 8


class Predictor:
    """``predictor(images, rgb=False)`` -> one result per image (a single image: one result).

    ``backend`` says what runs the network and ``reason`` why it was chosen.
    """

    def __init__(self, session, processor, *, model: str, family: str, reason: str, precision: str, source: str):
        self.session = session
        self.processor = processor
        self.model = model
        self.family = family
        self.reason = reason
        self.precision = precision
        self.source = source
        self.info = session.info
        self.stream = getattr(session, "stream", None)
        self._post_stream = None  # finish_gpu's own stream, for batches that kept their outputs
        # on a GPU, preprocessing is captured as one CUDA graph per frame shape and replayed (a camera's
        # frames repeat their shape): one launch instead of a dozen small kernels per frame
        self.graph_preprocess = bool(getattr(processor, "gpu_graphable", False))
        self._pre_graphs: dict[tuple, object] = {}  # key -> PreGraph, or False where it could not be captured
        self._pre_replayed = None  # the PreGraph the call being submitted replayed (its ``read_done`` set after)
        self._pre_binding = False  # a PreGraph was given frames ahead (``bind_ahead``): calls look for theirs
        self._post_graphs: dict[tuple, object] = {}  # the queued decode's graphs (``_queue_postprocess``)
        self._post_seen: dict[tuple, int] = {}
        self._step_graphs: dict[tuple, object] = {}  # whole steps as one graph (``step_graph``)
        self._step_seen: dict[tuple, int] = {}
        self._bound_step = None  # the StepGraph ``bind_ahead`` gave frames to last (``launch_bound`` replays it)
        self._timing_events: list = []  # CUDA events (timing) whose figures were read: reused, not made per frame
        self._device = None  # the session's torch.device, made once (torch makes one in about 8 us)
        self._serving = threading.local()  # ``serving``: this thread stays on the predictor's stream, inference mode

    @property
    def backend(self) -> str:
        return self.info.backend

    @property
    def device(self) -> str:
        return self.info.device

    def describe(self) -> dict:
        return {"model": self.model, "family": self.family, "backend": self.backend, "device": self.device,
                "precision": self.precision, "source": self.source, "reason": self.reason}

    def torch_device(self):
        """The session's device as a ``torch.device`` (made once)."""
        if self._device is None:
            import torch

            self._device = torch.device(self.info.device)
        return self._device

    @contextlib.contextmanager
    def serving(self):
        """For a thread that serves this predictor's GPU batches one after another (a stream's dispatching thread,
        which queues them, and the model's own, which finishes them): the thread stays on the predictor's CUDA
        stream and in inference mode while inside, so that ``submit_gpu`` and ``finish_gpu`` do not enter them again
        for every batch (about 20 us of host time each, measured on an H200 machine). Elsewhere they enter them as
        before."""
        if not self.info.on_gpu or self.stream is None:
            yield
            return
        import torch

        with torch.cuda.stream(self.stream), torch.inference_mode():
            self._serving.stream = self.stream
            try:
                yield
            finally:
                self._serving.stream = None

    def _on(self, stream):
        """``stream``'s context and inference mode, or nothing where this thread is ``serving`` on ``stream``."""
        if getattr(self._serving, "stream", None) is stream:
            return contextlib.nullcontext()
        import torch

        if torch.is_inference_mode_enabled():  # a stream's dispatching thread with several models: only the stream
            return torch.cuda.stream(stream)
        return _StreamMode(torch.cuda.stream(stream), torch.inference_mode())

    # -- inputs ---------------------------------------------------------------------------------
    def _frames(self, images) -> tuple[list, list[str | None], bool]:
        single = isinstance(images, (str, Path)) or (
            (isinstance(images, np.ndarray) or _is_torch(images)) and images.ndim == 3)
        if single:
            items = [images]
        elif isinstance(images, np.ndarray) or _is_torch(images):
            if images.ndim != 4:
                raise UsageError(f"expected an HxWx3 image or an NxHxWx3 batch, got shape {tuple(images.shape)}")
            items = list(images)
        else:
            items = list(images)
        frames, names = [], []
        for item in items:
            if isinstance(item, (str, Path)):
                frames.append(read_image(item))
                names.append(str(item))
            else:
                if item.ndim != 3 or item.shape[-1] != 3:
                    raise UsageError(f"expected an HxWx3 image, got shape {tuple(item.shape)}")
                frames.append(item)
                names.append(None)
        return frames, names, single

    # -- running --------------------------------------------------------------------------------
    def __call__(self, images, *, rgb: bool = False):
        frames, names, single = self._frames(images)
        results = self.predict_frames(frames, rgb=rgb)
        for r, n in zip(results, names):
            r.source = n
        return results[0] if single else results

    def chunks(self, frames: list, batch: int | None = None) -> list[tuple[tuple[int, int], list[int]]]:
        """How ``frames`` go through the network: (network H x W, frame indices) per inference call.

        Frames of one network size share a call, at most ``batch`` frames (default: the session's
        largest batch, else 16) per call."""
        groups: dict[tuple, list[int]] = {}
        for i, f in enumerate(frames):
            groups.setdefault(tuple(self.processor.input_hw(tuple(f.shape[:2]))), []).append(i)
        limit = self.info.max_batch or 16
        if batch is not None:
            if batch < 1:
                raise UsageError(f"batch {batch}: expected a positive number of frames per inference")
            limit = min(limit, batch)
        return [(hw, idx[start:start + limit]) for hw, idx in groups.items() for start in range(0, len(idx), limit)]

    def predict_frames(self, frames: list, *, rgb: bool = False, batch: int | None = None) -> list:
        results: list = [None] * len(frames)
        for hw, chunk in self.chunks(frames, batch):
            out = self.run_chunk([frames[i] for i in chunk], hw, rgb)
            for i, r in zip(chunk, out):
                results[i] = r
        return results

    def run_chunk(self, frames: list, hw, rgb: bool = False) -> list:
        """One inference call: ``frames`` (all of network size ``hw``) -> their results, stages timed."""
        if self.info.on_gpu:
            return self.finish_gpu(self.submit_gpu(frames, hw, rgb))
        t0 = time.perf_counter()
        x = self.preprocess_cpu(frames, hw, rgb)
        t1 = time.perf_counter()
        outputs = self.infer_cpu(x)
        t2 = time.perf_counter()
        results = self.postprocess(outputs, [tuple(f.shape[:2]) for f in frames], hw)
        t3 = time.perf_counter()
        for r in results:
            r.timings.share((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, len(results))
        return results

    # -- the stages, one by one (the streaming pipeline runs them in their own threads on the CPU) ------
    def preprocess_cpu(self, frames: list, hw, rgb: bool = False) -> np.ndarray:
        """Host frames -> the session's input batch (numpy), for a session on the CPU."""
        batch = []
        for f in frames:
            f = f.cpu().numpy() if _is_torch(f) else np.asarray(f)
            if f.dtype != np.uint8:
                raise UsageError(f"expected uint8 images, got {f.dtype}")
            batch.append(self.processor.preprocess_cpu(f if rgb else np.ascontiguousarray(f[..., ::-1]), hw))
        return np.stack(batch)

    def infer_cpu(self, x) -> dict:
        """The network on a batch: outputs by name (fresh arrays: the next call does not overwrite them)."""
        return self.session(x)

    def postprocess(self, outputs: dict, image_hws: list, hw) -> list:
        return self.processor.postprocess(outputs, image_hws, hw)

    def host_frames(self, frames: list, hw) -> list:
        """The frames as they are uploaded: brought to ``hw`` on the host where the processor says so
        (``host_step``/``preprocess_host``: Ultralytics' letterbox with OpenCV on uint8, as its predictor), so
        that only exact steps run on the device; a frame already on the GPU is read back for it."""
        step = getattr(self.processor, "host_step", None)
        out = []
        for f in frames:
            if step is not None and step(tuple(f.shape[:2]), tuple(hw)):
                f = f.cpu().numpy() if _is_torch(f) else np.asarray(f)
                if f.dtype != np.uint8:
                    raise UsageError(f"expected uint8 images, got {f.dtype}")
                f = self.processor.preprocess_host(f, hw)
            out.append(f)
        return out

    def device_input(self, frames: list, hw, rgb: bool = False, device=None):
        """Frames -> the session's input batch on ``device`` (default: the session's), as a session on a GPU
        gets it: ``host_frames``, the upload of uint8, then ``preprocess_gpu`` (any torch device: on the CPU
        the same steps give what the GPU computes, up to the device's arithmetic)."""
        import torch

        device = torch.device(device) if device is not None else self.torch_device()
        frames = self.host_frames(frames, hw)
        if device.type != "cuda":
            return self._device_batch(frames, hw, rgb, device)[0]
        # as the predictor's own calls run it: on its stream, in inference mode (a graph captured by an earlier call
        # keeps its buffers as inference tensors); a copy of the graph's output, which its next replay rewrites
        stream = self.stream or torch.cuda.current_stream(device)
        with self._on(stream):
            x, fixed = self._device_batch(frames, hw, rgb, device, stream)
            if fixed:
                x = x.clone()
        torch.cuda.current_stream(device).wait_stream(stream)
        return x

    def _device_batch(self, frames: list, hw, rgb: bool, device, stream=None, lent=None):
        """``(batch, fixed)``: the session's input on ``device`` and whether it is a replayed graph's own output
        (the same tensor at each call of its shape: ``Backend.infer_fixed``). Frames copied into the preprocessing
        graph's input ahead of the call (``bind_ahead``) are not copied again."""
        entry = self._pre_graphs.get(self._pre_key(frames, hw, rgb)) if self._pre_binding else None
        if entry:
            bound, entry.bound = entry.bound, None
            if bound is not None and bound == tuple([token(f) for f in frames]):
                entry.graph.replay()  # its input holds these frames already, and this stream waited for the copy
                self._pre_replayed = entry
                return entry.static_out, True
        return self._preprocess_gpu(self._uploads(frames, device, stream, lent), hw, rgb, device)

    def _pre_key(self, frames: list, hw, rgb: bool):
        """The preprocessing graph's key for host frames (uint8) as ``_preprocess_gpu`` makes it of their tensors."""
        import torch

        return (tuple([(torch.Size(f.shape), torch.uint8) for f in frames]), tuple(hw), rgb)

    def _uploads(self, frames: list, device, stream=None, lent: list | None = None) -> list:
        """The frames as tensors for ``_preprocess_gpu`` (on ``device``, or host frames over their own memory where
        the preprocessing graph copies them in itself). ``lent``: where given, a frame in a pinned buffer a stream
        lent also goes to the graph's input in one copy, straight from that buffer, and its tensor is added here:
        the caller marks it ``uploaded`` once the copy is queued."""
        import torch

        tensors = []
        # on a GPU whose preprocessing replays a graph, a host frame goes straight into the graph's own input (one
        # copy, no frame-sized buffer on the device in between); elsewhere to the device first
        into_graph = device.type == "cuda" and self.graph_preprocess
        for f in frames:
            if _is_torch(f):
                t = f
            elif device.type == "cuda":
                t = self._upload(f, device, stream, host=into_graph, lent=lent)
            else:
                f = np.asarray(f)
                if f.dtype != np.uint8:
                    raise UsageError(f"expected uint8 images, got {f.dtype}")
                t = torch.from_numpy(np.ascontiguousarray(f))
            tensors.append(t if t.device == device or (into_graph and t.device.type == "cpu")
                           else t.to(device, non_blocking=True))
        return tensors

    def _upload(self, f, device, stream=None, *, host: bool = False, lent: list | None = None):
        """A host frame to the GPU on ``stream`` (default: the current one): where its decoder put it already (a
        stream's source), from the pinned buffer it was decoded into (one asynchronous copy), else straight from
        its own memory: CUDA stages pageable memory itself and returns once it has read the frame, so the array
        may change or go at once (measured on an H200 machine: faster per frame than a copy into a pinned buffer
        first, 1.57 against 1.64 ms for a trained YOLOv8s on a 1080x810 photograph). ``host``: such a frame is
        given as a CPU tensor over its own memory, for the caller to copy where it goes (``_preprocess_gpu``), and so
        is a pinned one where ``lent`` collects them (``_uploads``)."""
        import torch

        f = np.asarray(f)
        if f.dtype != np.uint8:
            raise UsageError(f"expected uint8 images, got {f.dtype}")
        early = decoded_on_device(f, device, stream)
        if early is not None:  # its decoder copied it to the device already (a stream's source)
            return early
        pinned = pinned_tensor(f)
        if pinned is not None and host and lent is not None:  # into the graph's input from it, one copy
            lent.append(pinned)
            return pinned
        if pinned is not None:  # decoded into pinned memory (a stream's source): one copy, straight from it
            on_device = pinned.to(device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            uploaded(pinned, event)
            return on_device
        frame = torch.from_numpy(np.ascontiguousarray(f))
        return frame if host else frame.to(device, non_blocking=True)

    def submit_gpu(self, frames: list, hw, rgb: bool = False, *, keep_outputs: bool = False) -> "GpuBatch":
        """Queue upload, preprocessing and the network for ``frames`` on the predictor's stream; returns
        at once (the GPU works on). ``keep_outputs``: copy the outputs out of the session's buffers (which
        its next call reuses) so that the next batch may be queued before this one is postprocessed."""
        import torch

        device = self.torch_device()
        stream = self.stream or torch.cuda.current_stream(device)
        shapes = [tuple(f.shape[:2]) for f in frames]
        t0 = time.perf_counter()
        frames = self.host_frames(frames, hw)
        host_ms = (time.perf_counter() - t0) * 1e3
        lent: list = []  # pinned frames copied straight into a graph's input
        with self._on(stream):
            step = None if keep_outputs else self._step_graph(frames, shapes, tuple(hw), rgb, device, stream, lent)
            if step is not None:  # the whole step in one launch
                _mark_uploaded(lent, stream)
                return GpuBatch(shapes, tuple(hw), step.outputs, step.events, stream, False, host_ms, step)
            events = self._events(3)
            events[0].record(stream)
            self._pre_replayed = None
            x, fixed = self._device_batch(frames, hw, rgb, device, stream, lent)
            events[1].record(stream)
            if self._pre_replayed is not None:  # its input is free once this event has happened (``bind_ahead``)
                self._pre_replayed.read_done, self._pre_replayed = events[1], None
            _mark_uploaded(lent, stream)
            outputs = self.session.infer_fixed(x) if fixed else self.session(x)
            if keep_outputs:
                outputs = {k: v.clone() for k, v in outputs.items()}
            events[2].record(stream)
        return GpuBatch(shapes, tuple(hw), outputs, events, stream, keep_outputs, host_ms)

    def finish_gpu(self, batch: "GpuBatch") -> list:
        """Postprocess a submitted batch: on the predictor's stream, or (a batch that kept its outputs) on a
        stream of its own, so the next batch's network runs meanwhile. Waits for the results."""
        import torch

        if batch.step is not None:
            return self._finish_step(batch)
        if batch.kept:
            if self._post_stream is None:
                self._post_stream = torch.cuda.Stream(device=self.torch_device())
            stream = self._post_stream
            stream.wait_event(batch.events[2])
            for v in batch.outputs.values():
                v.record_stream(stream)  # made on the predictor's stream, read on this one
        else:
            stream = batch.stream
        start, = self._events(1)
        host_ms = 0.0
        with self._on(stream):
            start.record(stream)
            # queued with no wait where the processor can (detection: one graph launch, one copy of the kept rows at
            # the end), so the host queues it while the network still runs; else step by step, waiting where it must
            queued = self._queue_postprocess(batch, stream)
            if queued is not None:
                end, build = queued  # the device's part ends with the copy of the results (a timing event)
                end.synchronize()
                t0 = time.perf_counter()
                results = build()
                host_ms = (time.perf_counter() - t0) * 1e3  # the host's part, timed apart
            else:
                results = self.processor.postprocess(batch.outputs, batch.shapes, batch.hw)
                end, = self._events(1)
                end.record(stream)
                end.synchronize()
        pre, inf = (batch.events[i].elapsed_time(batch.events[i + 1]) for i in range(2))
        pre += batch.host_ms
        post = start.elapsed_time(end) + host_ms
        self._timing_events.extend((*batch.events, start, end))  # read: free to be recorded again
        for r in results:
            r.timings.share(pre, inf, post, len(results))
        return results

    def _step_key(self, frames: list, shapes: list, hw: tuple, rgb: bool):
        """Which step graph a call of ``frames`` replays (None: none, on this session or device)."""
        if getattr(self.session, "forward_in_graph", None) is None or not self.graph_preprocess:
            return None
        return (tuple([(f.shape, str(f.dtype)) for f in frames]), tuple(shapes), hw, rgb)

    def _step_graph(self, frames: list, shapes: list, hw: tuple, rgb: bool, device, stream, lent=None):
        """This step's own graph with the frames copied in and replayed (``step_graph``), where the session runs
        inside one and the step could be captured; None: the stages run one by one (the first step of these
        shapes, and wherever it cannot). Frames copied into its input ahead of the step (``bind_ahead``) are
        not copied again."""
        key = self._step_key(frames, shapes, hw, rgb) if device.type == "cuda" else None
        if key is None:
            return None
        entry = self._step_graphs.get(key)
        if entry is None:
            # the first runs stage by stage: cuDNN's algorithms picked, the session's graph captured
            if not _second_sighting(self._step_seen, self._step_graphs, key, STEP_GRAPHS):
                return None
            tensors = self._uploads(frames, device, stream, lent)
            plan = getattr(self.processor, "queued_decode", None)
            entry = self._step_graphs[key] = capture_step(
                tensors, lambda static_in: self._eager_preprocess(static_in, hw, rgb), self.session.forward_in_graph,
                (lambda outputs: plan(outputs, shapes, hw)) if plan is not None else None, capture_graph, device) or False
            if entry is not False:
                entry.replay(tensors)
            return entry or None
        if entry is False:
            return None
        bound, entry.bound = entry.bound, None
        launched, entry.launched = entry.launched, None
        tokens = tuple([token(f) for f in frames]) if bound is not None or launched is not None else None
        if launched is not None and launched == tokens:
            return entry  # replayed already for these frames (``launch_bound``)
        if bound is not None and bound == tokens:
            entry.graph.replay()  # its input holds these frames already (``bind_ahead``), and this stream waited
        else:
            entry.replay(self._uploads(frames, device, stream, lent))
        return entry

    def launch_bound(self, frames: list) -> bool:
        """Replay now the step graph whose input holds ``frames`` already (``bind_ahead``), before this call's own
        bookkeeping: the ``submit_gpu`` of the same frames that follows replays nothing and gives the step. A
        stream's dispatching thread launches every model's graph so before any model's submission, so the model
        queued second does not wait for the first's bookkeeping (measured on an H200 machine, yolo12n and depth on
        one frame: the second's graph started 0.14 ms after the first's). False (nothing done) where no graph holds
        them."""
        entry, self._bound_step = self._bound_step, None
        if entry is None or entry.bound is None or entry.bound != tuple([token(f) for f in frames]):
            return False
        import torch

        stream = self.stream or torch.cuda.current_stream(self.torch_device())
        with self._on(stream):
            entry.graph.replay()
        entry.launched, entry.bound = entry.bound, None
        return True

    def bind_ahead(self, frames: list, hw, rgb: bool, pool, *, keep_outputs: bool = False) -> bool:
        """Copy ``frames`` (a stream's next call for this predictor, each a whole buffer lent by ``pool``) straight
        into the input of the graph that call will replay first (the step's own graph, else the preprocessing's),
        now, while the step before runs: on the pool's stream, once that graph's last replay has read its input
        (the event after its preprocessing), with this predictor's stream made to wait for the copy. The call then
        replays the graph with no copy and no wait of its own (its frames known by ``pinned.token``; other frames
        are copied over as before). False (nothing done) where there is no such graph yet."""
        if not self.info.on_gpu or not self.graph_preprocess:
            return False
        hw = tuple(hw)
        host = getattr(self.processor, "host_step", None)
        if host is not None and any(host(tuple(f.shape[:2]), hw) for f in frames):
            return False  # these frames are brought to hw on the host first: not what the graph reads
        key = None if keep_outputs else self._step_key(frames, [tuple(f.shape[:2]) for f in frames], hw, rgb)
        entry = self._step_graphs.get(key) if key is not None else None
        pre = not entry
        if pre:
            entry = self._pre_graphs.get(self._pre_key(frames, hw, rgb))
        if not entry or not entry.bindable or entry.read_done is None:
            return False
        tokens = tuple([token(f) for f in frames])
        if any(t is None for t in tokens):
            return False
        import torch

        stream = self.stream or torch.cuda.current_stream(self.torch_device())
        entry.bound = None
        for f, dest in zip(frames, entry.static_in):
            done = pool.copy_into(f, dest, entry.read_done)
            if done is None:
                return False
            stream.wait_event(done)
        entry.bound = tokens
        self._pre_binding = self._pre_binding or pre
        self._bound_step = None if pre else entry
        return True

    def _finish_step(self, batch: "GpuBatch") -> list:
        """``finish_gpu`` of a step that replayed its own graph: its stage times from the events inside it."""
        step, stream = batch.step, batch.stream
        host_ms = 0.0
        if step.spec is not None:
            step.done.synchronize()
            t0 = time.perf_counter()
            results = step.spec.results(step.arrays, step.outputs)
            host_ms = (time.perf_counter() - t0) * 1e3
            end = step.done
        else:  # the processor's own postprocessing, after the graph, on its stream
            end, = self._events(1)
            with self._on(stream):
                results = self.processor.postprocess(step.outputs, batch.shapes, batch.hw)
                end.record(stream)
            end.synchronize()
        e = step.events
        pre = e[0].elapsed_time(e[1]) + batch.host_ms
        inf = e[1].elapsed_time(e[2])
        post = e[2].elapsed_time(end) + host_ms
        if end is not step.done:
            self._timing_events.append(end)  # read: free to be recorded again
        for r in results:
            r.timings.share(pre, inf, post, len(results))
        return results

    def _events(self, count: int) -> list:
        """``count`` timing CUDA events: ones already read where there are, else new."""
        import torch

        pool, out = self._timing_events, []
        for _ in range(count):
            try:  # a stream's dispatching thread and its model's thread both take events (submit, finish)
                out.append(pool.pop())
            except IndexError:
                out.append(torch.cuda.Event(enable_timing=True))
        return out

    def _queue_postprocess(self, batch: "GpuBatch", stream):
        """The processor's ``queued_decode`` for ``batch``, replayed from a CUDA graph captured per output shapes
        and frame sizes (eager where it cannot be captured), its packed results copied to reused pinned buffers:
        ``(ready, build)``, the event after that copy and a callable that makes the results once it has happened.
        None where the processor has no such path."""
        import torch

        plan = getattr(self.processor, "queued_decode", None)
        spec = plan(batch.outputs, batch.shapes, batch.hw) if plan is not None else None
        if spec is None:
            return None
        outputs = batch.outputs
        key = (spec.key, tuple((k, tuple(v.shape), v.dtype) for k, v in outputs.items()))
        entry = self._post_graphs.get(key)
        if entry is None and _second_sighting(self._post_seen, self._post_graphs, key, POST_GRAPHS):
            entry = self._post_graphs[key] = self._capture_postprocess(spec, outputs)
        if entry is None or entry is False:
            packed = spec.run(outputs)
            hosts = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in packed]
        else:
            static_in, graph, packed, hosts = entry
            for k, v in outputs.items():
                if static_in[k] is not v:  # the session's own buffers (the same at each call) are read where they are
                    static_in[k].copy_(v, non_blocking=True)
            graph.replay()
        for h, p in zip(hosts, packed):
            h.copy_(p, non_blocking=True)  # read back by this call, before the next replay can rewrite it
        ready = self._events(1)[0]
        ready.record(stream)
        return ready, lambda: spec.results([h.numpy() for h in hosts], outputs)

    def _capture_postprocess(self, spec, outputs: dict):
        """The decode captured reading ``outputs`` themselves (kept here: a session's buffers, rewritten in place by
        its next call, or a batch's copies); outputs that are other tensors are copied into them before a replay,
        on the same stream."""
        import torch

        static_in = dict(outputs)
        try:
            graph, packed = capture_graph(lambda: spec.run(static_in), self.torch_device())
        except RuntimeError:
            return False
        return static_in, graph, packed, [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in packed]

    def _eager_preprocess(self, tensors: list, hw, rgb: bool):
        import torch

        # one kernel per frame from its bytes where the processor has one (the detector's letterbox), else its steps
        fused = getattr(self.processor, "preprocess_frames", None)
        x = fused(tensors, hw, rgb) if fused is not None else None
        if x is not None:
            return x
        batch = []
        # BGR to RGB after the processor's steps where they treat every channel alike (the letterbox): the
        # channels of the small input swapped, not those of the whole frame (the same values)
        late = not rgb and getattr(self.processor, "channel_wise", False)
        for t in tensors:
            chw = t.permute(2, 0, 1)
            if not rgb and not late:
                chw = chw.flip(0)  # on the frame's bytes, before they become floats (a quarter of the memory)
            x = self.processor.preprocess_gpu(chw.float(), hw)
            batch.append(x.flip(0) if late else x)
        x = torch.stack(batch).contiguous()
        return x if x.dtype == torch.float32 else x.float()

    def _preprocess_gpu(self, tensors: list, hw, rgb: bool, device):
        """``(batch, fixed)``: the batch for the session, on the current stream, replayed from a captured graph
        where one exists (``fixed``: the graph's own output, the same tensor at each replay)."""
        if not self.graph_preprocess or device.type != "cuda":
            return self._eager_preprocess(tensors, hw, rgb), False
        key = (tuple([(t.shape, t.dtype) for t in tensors]), tuple(hw), rgb)
        entry = self._pre_graphs.get(key)
        if entry is None:
            entry = self._pre_graphs[key] = self._capture_preprocess(tensors, hw, rgb, device)
        if entry is False:  # this processor's preprocessing could not be captured: run it as it is
            tensors = [t.to(device, non_blocking=True) for t in tensors]
            return self._eager_preprocess(tensors, hw, rgb), False
        entry.bound = None  # frames copied in ahead, if any, were not these: copied over, after that copy
        for s, t in zip(entry.static_in, tensors):
            s.copy_(t, non_blocking=True)  # from the device, or from a host frame's own memory (``_upload``)
        entry.graph.replay()
        self._pre_replayed = entry
        return entry.static_out, True  # rewritten by the next replay, after the session has read it on this stream

    def _capture_preprocess(self, tensors: list, hw, rgb: bool, device):
        import torch

        static_in = [torch.empty(t.shape, dtype=t.dtype, device=device).copy_(t) for t in tensors]
        try:
            graph, static_out = capture_graph(lambda: self._eager_preprocess(static_in, hw, rgb), device)
        except RuntimeError:  # e.g. a host-to-device copy inside the preprocessing
            return False
        return PreGraph(static_in, graph, static_out, bindable=not any(shares_memory(static_out, t) for t in static_in))


def _mark_uploaded(lent: list, stream) -> None:
    """The pinned frames in ``lent`` were copied on ``stream`` (queued): not lent again before the copies are done."""
    if lent:
        import torch

        event = torch.cuda.Event()
        event.record(stream)
        for t in lent:
            uploaded(t, event)
        lent.clear()


def _second_sighting(seen: dict, graphs: dict, key, keep: int) -> bool:
    """Whether a graph for ``key`` is captured now: from a key's second sighting (a camera's frames repeat their size;
    a folder of photographs of many sizes runs eagerly), with room made in ``graphs`` for it (at most ``keep``, the
    oldest dropped)."""
    if len(seen) > 4096:  # a stream of ever new sizes: forget the counts
        seen.clear()
    count = seen[key] = seen.get(key, 0) + 1
    if count < 2:
        return False
    while len(graphs) >= keep:
        graphs.pop(next(iter(graphs)))
    return True


class _StreamMode:
    """A CUDA stream's context and inference mode, entered and left together."""

    __slots__ = ("stream", "mode")

    def __init__(self, stream, mode):
        self.stream, self.mode = stream, mode

    def __enter__(self):
        self.stream.__enter__()
        self.mode.__enter__()

    def __exit__(self, *exc):
        try:
            self.mode.__exit__(*exc)
        finally:
            self.stream.__exit__(*exc)


class Pipeline:
    """Several predictors on one stream of frames; on a GPU each runs on its own CUDA stream, concurrently.

    ``pipeline(frame)`` runs every model on one frame; ``pipeline.stream(sources)`` streams frames from
    sources through them with decoding, preprocessing, inference and postprocessing overlapped
    (``enginekit.runtime.stream``)."""

    def __init__(self, predictors: list[Predictor]):
        self.predictors = predictors
        self._pool = None
        if len(predictors) > 1 and any(p.info.on_gpu for p in predictors):
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=len(predictors))

    def __call__(self, frame, *, rgb: bool = False) -> list:
        """One frame -> one result per predictor, in order."""
        if self._pool is None:
            return [p(frame, rgb=rgb) for p in self.predictors]
        futures = [self._pool.submit(p, frame, rgb=rgb) for p in self.predictors]
        return [f.result() for f in futures]

    def stream(self, sources, options=None, names=None):
        """A ``Stream`` of ``sources`` (iterables of ``(name, frame)``) through these predictors: iterate it for
        each step's results in order; ``.stats()`` for the figures (``enginekit.runtime.stream``)."""
        return Stream(self.predictors, sources, options, names)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
