"""The streaming pipeline: frames from one or several sources through several models, stages overlapped.

    decode (one thread per source) -> a bounded queue per source (the drop policy applies here)
      -> steps: K frames of each source (stereo or several cameras: one batch)
      -> per model, on the steps its cadence takes: preprocess -> infer -> postprocess
         CPU: one thread per stage, so a model preprocesses step N+1 while it infers step N;
         GPU: the dispatching thread queues each step's upload, preprocessing and network on the
         model's CUDA stream as it dispatches the step (no hand-over before the network); the model's
         own thread postprocesses them in order, step N on a stream of its own while step N+1's
         network runs
      -> results in step order, each step once every model due on it has answered

``Stream(predictors, sources, options)`` is an iterator of ``StepResult``; ``stats()`` gives each
stage's and the whole step's p50/p95/p99 and frames per second. What keeps the figures steady: each
model warms up on every new input shape before the step that brings it is dispatched, with nothing
else in flight (ONNX Runtime's arena, cuDNN's algorithm choice, the CUDA graphs preprocessing and
ORT capture are made then, untimed), Python's garbage collector is held off the
long-lived heap while the stream runs (``gc.freeze``: with torch and Ultralytics loaded a full
collection walks about 200,000 objects, 0.2 to 0.8 s on a 2-core x86-64 CPU machine; what the
run keeps is frozen again every 64 steps), and pinned
host buffers and CUDA events are made once per frame shape and reused. Nothing here prints.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from enginekit.errors import EnginekitError, ModelFailed, UsageError
from enginekit.runtime.pinned import pool_for

#: ``--drop``: what happens when frames come faster than the models take them (the queue between
#: decoding and the models is full)
DROP_POLICIES: dict[str, str] = {
    "none": "never drop: decoding waits for room (every frame of a file is processed; a live camera falls "
            "behind, and its driver's own buffer drops frames)",
    "oldest": "the oldest waiting frame makes room for the new one: the models always get the freshest "
              "frame (least latency; for live cameras)",
    "newest": "the new frame is dropped and the frames already waiting go on (the first frames of a burst "
              "are kept)",
}
STAGES = ("preprocess", "infer", "postprocess")
#: while the collector is held, what the stream and its caller keep (results, records) is frozen every this
#: many steps, so a long run's full collections never walk it either (gc.freeze only moves lists: O(1))
REFREEZE_EVERY = 64
PERCENTILES = (50, 95, 99)


def parse_every(items: Iterable[str] | None) -> dict[str, int]:
    """``["depth=3"]`` -> ``{"depth": 3}``: a model runs on every N-th step (default every step)."""
    every: dict[str, int] = {}
    for item in items or []:
        for part in str(item).split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, value = part.partition("=")
            if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
                raise UsageError(f"--every {part!r}: expected MODEL=N with N a positive whole number (depth=3)")
            every[name.strip()] = int(value)
    return every


@dataclass(frozen=True)
class StreamOptions:
    """How a stream runs; every value is checked when it is made."""

    drop: str = "none"  # DROP_POLICIES
    queue: int = 2  # frames waiting per source between decoding and the models
    every: Mapping[str, int] = field(default_factory=dict)  # model -> run on every N-th step
    frames_per_step: int = 1  # K consecutive frames of each source form one step (one batch)
    batch: int | None = None  # frames per inference call (default: the whole step)
    in_flight: int = 2  # steps the models work on at once: 1 = least latency, 2 = stages overlap
    warmup: int = 2  # untimed runs of each model on each new input shape
    pace: float | None = None  # frames per second a source delivers (as a camera would); None: as decoded
    rgb: bool = False  # frames are RGB (default: BGR, as OpenCV decodes)
    hold_gc: bool = True  # gc.freeze() while the stream runs

    def __post_init__(self) -> None:
        if self.drop not in DROP_POLICIES:
            raise UsageError(f"--drop {self.drop!r}: choose {', '.join(DROP_POLICIES)}")
        for flag, value in (("--queue", self.queue), ("--frames-per-step", self.frames_per_step),
                            ("--in-flight", self.in_flight)):
            if not isinstance(value, int) or value < 1:
                raise UsageError(f"{flag} {value}: expected a positive whole number")
        if self.batch is not None and (not isinstance(self.batch, int) or self.batch < 1):
            raise UsageError(f"--batch {self.batch}: expected a positive whole number")
        if self.warmup < 0:
            raise UsageError(f"--warmup {self.warmup}: expected zero or more")
        if self.pace is not None and not (isinstance(self.pace, (int, float)) and 0 < self.pace < float("inf")):
            raise UsageError(f"--pace {self.pace}: expected frames per second above 0")
        for name, n in self.every.items():
            if not isinstance(n, int) or n < 1:
                raise UsageError(f"--every {name}={n}: expected a positive whole number")


@dataclass
class Frame:
    """One decoded frame: which source, its index there, its name, the image and when it was read."""

    source: int
    index: int
    name: str
    image: Any
    decode_ms: float
    read_at: float  # perf_counter when reading it started


@dataclass
class ModelTimes:
    """One model on one step: its stages (summed over the step's inference calls) and its latency."""

    preprocess: float = 0.0
    infer: float = 0.0
    postprocess: float = 0.0
    latency: float = 0.0  # from the step's dispatch to this model's results
    #: per frame of the step: its share of the inference call it ran in ([pre, infer, post] ms, the call's frames)
    frames: dict = field(default_factory=dict)

    def share(self, stage: int, idx, ms: float) -> None:
        """``ms`` of one inference call's ``stage`` (0 pre, 1 infer, 2 post) shared by its frames ``idx``."""
        for i in idx:
            self.frames.setdefault(i, [0.0, 0.0, 0.0, len(idx)])[stage] += ms / max(len(idx), 1)


@dataclass
class StepResult:
    """One step: its frames and, per model that ran on it, one result per frame (in the frames' order)."""

    index: int
    frames: list[Frame]
    results: dict[str, list] = field(default_factory=dict)
    times: dict[str, ModelTimes] = field(default_factory=dict)
    dispatched: float = 0.0  # perf_counter when the step left the decode queues
    done: float = 0.0  # perf_counter when its last model answered

    @property
    def latency_ms(self) -> float:
        return (self.done - self.dispatched) * 1e3

    @property
    def age_ms(self) -> float:
        """From the moment its first frame was read to its last result: what a camera user waits."""
        return (self.done - min(f.read_at for f in self.frames)) * 1e3


class DropQueue:
    """A bounded queue of frames with a drop policy (``DROP_POLICIES``); ``close()`` ends it."""

    def __init__(self, size: int, policy: str):
        self.size, self.policy = size, policy
        self.items: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.closed = False
        self._owed = False  # a frame was taken without waking the decoder (``get(wake=False)``)
        self.dropped: list[int] = []  # frame indices dropped

    def put(self, item: Frame, stop: threading.Event) -> None:
        with self.cond:
            if self.policy == "none":
                while len(self.items) >= self.size and not stop.is_set():
                    self.cond.wait(0.1)
            elif len(self.items) >= self.size:
                if self.policy == "newest":
                    self.dropped.append(item.index)
                    return
                self.dropped.append(self.items.popleft().index)
            self.items.append(item)
            self.cond.notify_all()

    def get(self, stop: threading.Event, *, wake: bool = True) -> Frame | None:
        """The next frame; None once the queue is closed and empty (or the stream stops). ``wake=False``: the
        decoder waiting for room is not woken yet (``room``), so that it takes no share of the interpreter while
        the caller queues the frame's work on a GPU (on an H200 machine, Depth-Anything on torch: the network's
        launch 0.36 -> 0.24 ms after the step's dispatch, with the iterator's bookkeeping moved before it frees
        the step's slot)."""
        with self.cond:
            while not self.items and not self.closed and not stop.is_set():
                if self._owed:  # a frame taken without waking the decoder: it must go on to give this one
                    self._owed = False
                    self.cond.notify_all()
                self.cond.wait(0.1)
            if not self.items or stop.is_set():
                return None
            item = self.items.popleft()
            if wake:
                self._owed = False
                self.cond.notify_all()
            else:
                self._owed = True
            return item

    def room(self) -> None:
        """Wake the decoder waiting for room, where a ``get(wake=False)`` has not yet."""
        with self.cond:
            if self._owed:
                self._owed = False
                self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class _Failure:
    def __init__(self, error: BaseException, step: int | None = None):
        self.error, self.step = error, step  # step: the step a model failed on (None: not a model's step)


class _StepFailed(Exception):
    """A model's stage failed on a step: the steps before it still finish, then the stream stops."""

    def __init__(self, step: "StepResult", error: BaseException):
        super().__init__(step.index, error)
        self.step, self.error, self.frames = step.index, error, [f.name for f in step.frames]


@contextlib.contextmanager
def _on_step(step: "StepResult"):
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - carried to the caller's thread with its step
        raise _StepFailed(step, exc) from exc


def _model_failed(model: str, error: BaseException, frames: list[str], step: int | None) -> BaseException:
    """A model's failure as the stream gives it: enginekit's own errors as they are, anything else (the backend's
    exception) as ``ModelFailed``, naming the model and the frames, the exception its cause."""
    if isinstance(error, EnginekitError):
        return error
    failure = ModelFailed(model, error, frames, step)
    failure.__cause__ = error
    return failure


_END = object()


def _get(q: "queue.Queue", stop: threading.Event, timeout: float | None = None):
    """``q.get`` that gives up when the stream stops (returns _END), or after ``timeout`` (returns None)."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    while not stop.is_set():
        wait = 0.1 if deadline is None else min(0.1, max(0.0, deadline - time.perf_counter()))
        try:
            return q.get(timeout=wait)
        except queue.Empty:
            if deadline is not None and time.perf_counter() >= deadline:
                return None
    return _END


def _put(q: "queue.Queue", item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


class _Worker:
    """One model's stages over the steps it is given; answers ``(step, model, results, times)``."""

    def __init__(self, predictor, options: StreamOptions, answer, stop: threading.Event, fail, turn=None):
        self.predictor, self.options, self.answer, self.stop, self.fail = predictor, options, answer, stop, fail
        self.turn = turn or contextlib.nullcontext()  # models on the CPU infer in turns (each uses every core)
        self.inbox: queue.Queue = queue.Queue(maxsize=options.in_flight)
        self.seen: set = set()  # input shapes warmed up on
        self._chunks: dict = {}  # frame shapes -> the predictor's chunks of them
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        if self.predictor.info.on_gpu:
            self._spawn(self._gpu_loop)
        else:
            q1: queue.Queue = queue.Queue(maxsize=1)
            q2: queue.Queue = queue.Queue(maxsize=1)
            self._spawn(self._cpu_pre, q1)
            self._spawn(self._cpu_infer, q1, q2)
            self._spawn(self._cpu_post, q2)

    def _spawn(self, fn, *args) -> None:
        def run():
            try:
                fn(*args)
            except _StepFailed as failed:
                self.fail(_model_failed(self.predictor.model, failed.error, failed.frames, failed.step), failed.step)
            except BaseException as exc:  # noqa: BLE001 - carried to the caller's thread
                self.fail(exc)

        t = threading.Thread(target=run, name=f"enginekit-{self.predictor.model}-{fn.__name__}", daemon=True)
        t.start()
        self.threads.append(t)

    def chunks(self, images: list) -> list:
        """``predictor.chunks`` of a step's images, worked out once per frame shapes (a camera's repeat theirs)."""
        key = tuple(i.shape for i in images)
        chunks = self._chunks.get(key)
        if chunks is None:
            if len(self._chunks) > 256:  # ever new shapes (a folder of photographs): forget them
                self._chunks.clear()
            chunks = self._chunks[key] = self.predictor.chunks(images, self.options.batch)
        return chunks

    def shape_key(self, step: StepResult) -> tuple:
        images = [f.image for f in step.frames]
        return tuple((tuple(hw), tuple(tuple(images[i].shape) for i in idx)) for hw, idx in self.chunks(images))

    def send(self, step: StepResult) -> bool:
        """Give ``step`` to this model (on the dispatching thread). A GPU model's work is queued on the GPU here,
        at once: its thread is woken only to finish it (postprocessing), while the GPU runs the network; the
        frame's way to the network takes no hand-over between threads. Every session call of a GPU model,
        warm-ups included, is made from this one thread: ONNX Runtime's CUDA provider keeps a captured graph per
        thread. False when the stream stopped."""
        if not self.predictor.info.on_gpu:
            return _put(self.inbox, step, self.stop)
        p, o = self.predictor, self.options
        images = [f.image for f in step.frames]
        times = ModelTimes()
        try:
            with _on_step(step):
                chunks = self.chunks(images)
                keep = self._keep(chunks)
                item = (step, times, [(idx, p.submit_gpu([images[i] for i in idx], hw, o.rgb, keep_outputs=keep))
                                      for hw, idx in chunks])
        except _StepFailed as failed:  # raised by the model's thread once the steps before it are finished
            item = failed
        return _put(self.inbox, item, self.stop)

    def warm(self, step: StepResult) -> bool:
        """Untimed runs on ``step``'s input shapes when this model has not met them: ``--warmup`` of them, and
        at least the runs its backend needs before it shares the GPU (``capture_runs``); True when it ran."""
        key = self.shape_key(step)
        if key in self.seen:
            return False
        images = [f.image for f in step.frames]
        p, gpu = self.predictor, self.predictor.info.on_gpu
        runs = max(self.options.warmup, getattr(getattr(p, "session", None), "capture_runs", 0) if gpu else 0)
        chunks = self.chunks(images)
        for _ in range(runs):
            for hw, idx in chunks:
                chunk = [images[i] for i in idx]
                if gpu:  # the path the timed steps take
                    p.finish_gpu(p.submit_gpu(chunk, hw, self.options.rgb, keep_outputs=self._keep(chunks)))
                else:
                    p.run_chunk(chunk, hw, self.options.rgb)
        self.seen.add(key)
        return runs > 0

    # -- CPU: a thread per stage -------------------------------------------------------------------------
    def _cpu_pre(self, out: queue.Queue) -> None:
        p, o = self.predictor, self.options
        while (step := _get(self.inbox, self.stop)) is not _END:
            if step is None:
                continue
            if step is _STOP_WORKER:
                _put(out, _STOP_WORKER, self.stop)
                return
            images = [f.image for f in step.frames]
            times = ModelTimes()
            batches = []
            with _on_step(step):
                for hw, idx in p.chunks(images, o.batch):
                    t0 = time.perf_counter()
                    x = p.preprocess_cpu([images[i] for i in idx], hw, o.rgb)
                    times.preprocess += (dt := (time.perf_counter() - t0) * 1e3)
                    times.share(0, idx, dt)
                    batches.append((hw, idx, x))
            if not _put(out, (step, times, batches), self.stop):
                return

    def _cpu_infer(self, inbox: queue.Queue, out: queue.Queue) -> None:
        p = self.predictor
        while (item := _get(inbox, self.stop)) is not _END:
            if item is None:
                continue
            if item is _STOP_WORKER:
                _put(out, _STOP_WORKER, self.stop)
                return
            step, times, batches = item
            inferred = []
            with _on_step(step):
                for hw, idx, x in batches:
                    with self.turn:
                        t0 = time.perf_counter()
                        outputs = p.infer_cpu(x)
                        times.infer += (dt := (time.perf_counter() - t0) * 1e3)
                        times.share(1, idx, dt)
                    inferred.append((hw, idx, outputs))
            if not _put(out, (step, times, inferred), self.stop):
                return

    def _cpu_post(self, inbox: queue.Queue) -> None:
        p = self.predictor
        while (item := _get(inbox, self.stop)) is not _END:
            if item is None:
                continue
            if item is _STOP_WORKER:
                return
            step, times, inferred = item
            results: list = [None] * len(step.frames)
            with _on_step(step):
                for hw, idx, outputs in inferred:
                    t0 = time.perf_counter()
                    out = p.postprocess(outputs, [tuple(step.frames[i].image.shape[:2]) for i in idx], hw)
                    times.postprocess += (dt := (time.perf_counter() - t0) * 1e3)
                    times.share(2, idx, dt)
                    for i, r in zip(idx, out):
                        results[i] = r
            self._answer(step, results, times)

    def _answer(self, step: StepResult, results: list, times: ModelTimes) -> None:
        """Each result carries its step's stage times (summed over the step's inference calls)."""
        for i, (r, f) in enumerate(zip(results, step.frames)):
            r.source = f.name
            pre, infer, post, calls = times.frames.get(i) or [*(v / max(len(results), 1) for v in (
                times.preprocess, times.infer, times.postprocess)), len(results)]
            r.timings.share(pre, infer, post, 1)
            r.timings.batch = int(calls)  # the frames its inference call held
        times.latency = (time.perf_counter() - step.dispatched) * 1e3
        self.answer(step, self.predictor.model, results, times)

    # -- GPU: steps queued by the dispatching thread (``send``), finished on this model's own thread ---------
    def _gpu_loop(self) -> None:
        serving = getattr(self.predictor, "serving", None)  # on its CUDA stream, in inference mode, for the run
        with serving() if serving is not None else contextlib.nullcontext():
            self._gpu_steps()

    def _gpu_steps(self) -> None:
        """Finish the steps ``send`` queued on the GPU, in order (the next step's network runs meanwhile where
        two are in flight)."""
        while True:
            item = _get(self.inbox, self.stop)
            if item is _END or item is _STOP_WORKER:
                return
            if item is None:
                continue
            if isinstance(item, _StepFailed):  # its submission failed on the dispatching thread
                raise item
            self._gpu_finish(*item)

    def _keep(self, chunks: list) -> bool:
        """Whether a step's outputs are copied out of the session's buffers (postprocessed on a stream of their own):
        where another call is queued before they are read (two steps in flight, or a step of several calls); one
        step of one call in flight is postprocessed on the predictor's stream, straight from them."""
        return self.options.in_flight > 1 or len(chunks) > 1

    def _gpu_finish(self, step: StepResult, times: ModelTimes, submitted) -> None:
        with _on_step(step):
            results = self._gpu_results(step, times, submitted)
        self._answer(step, results, times)

    def _gpu_results(self, step: StepResult, times: ModelTimes, submitted) -> list:
        results: list = [None] * len(step.frames)
        for idx, batch in submitted:
            out = self.predictor.finish_gpu(batch)
            t = out[0].timings  # each result's share of the call: the call's time is the share times its frames
            times.preprocess += t.preprocess * t.batch
            times.infer += t.infer * t.batch
            times.postprocess += t.postprocess * t.batch
            for stage, ms in enumerate((t.preprocess, t.infer, t.postprocess)):
                times.share(stage, idx, ms * t.batch)
            for i, r in zip(idx, out):
                results[i] = r
        return results


_STOP_WORKER = object()


#: after a model fails on a step, how long the stream waits for a step before it that makes no progress
FAILURE_GRACE_S = 10.0


class Stream:
    """``for step in Stream(predictors, sources, options)``: every step's results, in order.

    ``sources``: iterables of ``(name, frame)`` (``enginekit.runtime.sources.FrameSource``, a list...);
    several sources are several cameras: each step holds ``frames_per_step`` frames of each, batched.
    ``options.every`` names a model by its predictor's ``model`` (or by the name it was loaded under,
    ``names``). The stream ends with its shortest source; ``close()`` (or leaving a ``with`` block) stops it.
    """

    def __init__(self, predictors: list, sources: list[Iterable], options: StreamOptions | None = None,
                 names: list[str] | None = None):
        if not predictors:
            raise UsageError("a stream needs at least one model")
        if not sources:
            raise UsageError("a stream needs at least one source")
        self.predictors = list(predictors)
        self.sources = list(sources)
        self.options = options or StreamOptions()
        self.models = [p.model for p in self.predictors]
        if len(set(self.models)) != len(self.models):
            raise UsageError(f"a model is given twice: {', '.join(self.models)}")
        self.every = self._cadence(names or self.models)
        self.stop = threading.Event()  # every thread ends
        self.halt = threading.Event()  # no new frame is read, no new step dispatched (a model failed on one)
        self.queues = [DropQueue(self.options.queue, self.options.drop) for _ in self.sources]
        self.done: queue.Queue = queue.Queue()  # what the workers answer, and failures
        self.slots = threading.Semaphore(self.options.in_flight)
        self.records: list[StepResult] = []  # every step yielded, without images or results: the figures
        self.gc_pauses: list[float] = []
        self._errors: list[BaseException] = []
        self._started = False
        self._threads: list[threading.Thread] = []
        self._workers: list[_Worker] = []
        self._pending: dict[int, StepResult] = {}
        self._due: dict[int, set] = {}
        self._dispatched = 0
        self.warmups = 0  # (model, input shape) warm-ups run
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._gc_frozen = False
        self._gc_start = 0.0
        self._warming = False
        self.started_at = self.ended_at = 0.0
        self._pinned = None  # pinned frame buffers the decoders read into (a model on a GPU)
        self._whole: dict[tuple, bool] = {}  # frame shape -> some GPU model takes such frames whole to the device

    def _cadence(self, names: list[str]) -> dict[str, int]:
        every = {m: 1 for m in self.models}
        aliases = {}
        for name, model, p in zip(names, self.models, self.predictors):
            for alias in (name, model, p.family):
                aliases.setdefault(alias, model)
        for key, n in self.options.every.items():
            if key not in aliases:
                raise UsageError(f"--every {key}={n}: no such model here (models: {', '.join(names)})")
            every[aliases[key]] = n
        return every

    # -- running ----------------------------------------------------------------------------------------
    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _fail(self, exc: BaseException, step: int | None = None) -> None:
        """A thread failed. A model failing on a step halts the stream (no new frame, no new step) and the
        steps before it still finish and are given; any other failure stops everything at once."""
        self.done.put(_Failure(exc, step))
        (self.halt if step is not None else self.stop).set()

    def _halted(self) -> bool:
        return self.stop.is_set() or self.halt.is_set()

    def _start(self) -> None:
        self._started = True
        if self.options.hold_gc:
            gc.collect()
            gc.freeze()
            self._gc_frozen = True
        gc.callbacks.append(self._gc_callback)
        self._pinned = pool_for(self.predictors)
        for i, source in enumerate(self.sources):
            self._thread(self._decode, i, source)
        # Models on the CPU infer in turns: ONNX Runtime's and torch's intra-op threads take every core, so two
        # at once only split the cores between them (and oversubscribe them); their other stages still overlap.
        on_cpu = [p for p in self.predictors if not p.info.on_gpu]
        turn = threading.Lock() if len(on_cpu) > 1 else None
        for p in self.predictors:
            w = _Worker(p, self.options, self._answer, self.stop, self._fail, None if p.info.on_gpu else turn)
            w.start()
            self._workers.append(w)
        self._thread(self._dispatch)
        self.started_at = time.perf_counter()

    def _thread(self, fn, *args) -> None:
        def run():
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001
                self._fail(exc)

        t = threading.Thread(target=run, name=f"enginekit-stream-{fn.__name__}", daemon=True)
        t.start()
        self._threads.append(t)

    def _gc_callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._warming:
            return
        elif info.get("generation") == 2 or (time.perf_counter() - self._gc_start) > 1e-3:  # full, or long
            self.gc_pauses.append((time.perf_counter() - self._gc_start) * 1e3)

    def _decode(self, i: int, source: Iterable) -> None:
        q, pace = self.queues[i], self.options.pace
        # where a model runs on a GPU, a source enginekit opened decodes into pinned buffers (one copy to the device)
        iterator = iter(source.frames_into(self._pinned.take) if self._pinned is not None
                        and hasattr(source, "frames_into") else source)
        index = 0
        first = time.perf_counter()
        try:
            while not self._halted():
                if pace:  # the frame arrives when a camera at this rate would give it
                    delay = first + index / pace - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                t0 = time.perf_counter()
                try:
                    name, image = next(iterator)
                except StopIteration:
                    return
                decode_ms = (time.perf_counter() - t0) * 1e3
                if self._pinned is not None and self._whole_frame_on_device(image):
                    self._pinned.upload(image)  # to the GPU now, while the steps before this frame's still run
                q.put(Frame(i, index, str(name), image, decode_ms, t0), self.stop)
                index += 1
        finally:
            q.close()

    def _whole_frame_on_device(self, image) -> bool:
        """Whether some model on a GPU takes a frame of this shape whole to the device (no step on the host first)."""
        shape = getattr(image, "shape", None)
        if shape is None or len(shape) != 3:
            return False
        known = self._whole.get(shape)
        if known is None:
            known = False
            for p in self.predictors:
                proc = getattr(p, "processor", None)
                if proc is None or not p.info.on_gpu:
                    continue
                step = getattr(proc, "host_step", None)
                if step is None or not step(shape[:2], proc.input_hw(shape[:2])):
                    known = True
            self._whole[shape] = known
        return known

    def _dispatch(self) -> None:
        # queuing a GPU model's steps (``_Worker.send``), this thread stays on its CUDA stream where there is one
        gpu = [p for p in self.predictors if p.info.on_gpu]
        serving = getattr(gpu[0], "serving", None) if len(gpu) == 1 else None
        with serving() if serving is not None else contextlib.nullcontext():
            self._dispatch_steps()

    def _dispatch_steps(self) -> None:
        k = self.options.frames_per_step
        index = 0
        try:
            while not self._halted():
                while not self.slots.acquire(timeout=0.1):
                    if self._halted():
                        return
                frames: list[Frame] = []
                for q in self.queues:
                    for _ in range(k):
                        f = q.get(self.stop, wake=False)  # woken once the step is given to the models (``room``)
                        if f is None:
                            break
                        frames.append(f)
                complete = len(frames) == k * len(self.queues)
                if not frames or (not complete and len(self.queues) > 1):
                    return  # a source ended (several cameras: at the first that ends)
                step = StepResult(index, frames)
                due = {m for m in self.models if index % self.every[m] == 0}
                new = [w for w in self._workers if w.predictor.model in due and w.shape_key(step) not in w.seen]
                if new:  # warm-ups run with nothing else in flight, before the step is timed
                    held = self._drain()
                    self._warming = True  # collections while warming up are not the stream's pauses
                    # the decoder makes no CUDA call meanwhile (a backend may capture its graph)
                    with self._pinned.held() if self._pinned is not None else contextlib.nullcontext():
                        try:
                            for w in new:
                                try:
                                    warmed = w.warm(step)  # here: the thread that makes the model's session calls
                                except Exception as exc:  # noqa: BLE001 - the model's failure on this step's frames
                                    names = [f.name for f in step.frames]
                                    raise _model_failed(w.predictor.model, exc, names, index) from exc
                                if warmed:
                                    self.warmups += 1
                        finally:
                            self._warming = False
                            for _ in range(held):
                                self.slots.release()
                step.dispatched = step.done = time.perf_counter()
                with self._lock:
                    self._pending[index] = step
                    self._due[index] = set(due)
                if not due:  # no model's turn (cadences): the step is done as it is
                    self.done.put(index)
                try:
                    for w in self._workers:
                        if w.predictor.model in due and not w.send(step):
                            return
                finally:
                    for q in self.queues:  # the decoders go on now: the step's GPU work is queued
                        q.room()
                index += 1
                self._dispatched = index
                if not complete:
                    return
        except BaseException as exc:  # noqa: BLE001 - given to the caller before the end marker below
            self._fail(exc)
        finally:
            for w in self._workers:
                _put(w.inbox, _STOP_WORKER, self.stop)
            self._ended.set()
            self.done.put(_END)

    def _drain(self) -> int:
        """Wait until no other step is in flight (this thread holds one slot already); the slots taken."""
        held = 0
        while held < self.options.in_flight - 1:
            if self.slots.acquire(timeout=0.1):
                held += 1
            elif self.stop.is_set():
                break
        return held

    def _answer(self, step: StepResult, model: str, results: list, times: ModelTimes) -> None:
        done = time.perf_counter()
        with self._lock:
            step.results[model] = results
            step.times[model] = times
            step.done = max(step.done, done)
            self._due[step.index].discard(model)
        self.done.put(step.index)

    def __iter__(self) -> Iterator[StepResult]:
        if self._started:
            raise RuntimeError("a Stream runs once")
        self._start()
        expected = 0
        ended = False
        failed: _Failure | None = None  # a model failed on a step: the steps before it are still given
        try:
            while True:
                if failed is not None and expected >= failed.step:
                    raise failed.error
                with self._lock:
                    ready = expected in self._due and not self._due[expected]
                    step = self._pending.pop(expected, None) if ready else None
                    if ready:
                        del self._due[expected]
                if step is not None:
                    self.ended_at = step.done
                    self.records.append(_record(step))
                    self.slots.release()  # after this thread's own bookkeeping: the next step's dispatch not slowed
                    expected += 1
                    if self._gc_frozen and expected % REFREEZE_EVERY == 0:
                        gc.freeze()  # what the steps so far left alive (the caller's records) joins the frozen heap
                    yield step
                    continue
                if ended and expected >= self._dispatched:
                    if failed is not None:
                        raise failed.error
                    break
                try:  # after a failure, a step before it that never finishes (its model died) ends the wait
                    item = self.done.get(timeout=FAILURE_GRACE_S if failed is not None else None)
                except queue.Empty:
                    item = failed  # raised below as it is (the wait's own exception is no part of it)
                if item is failed:
                    raise failed.error
                if isinstance(item, _Failure):
                    if item.step is None:
                        raise item.error
                    if failed is None or item.step < failed.step:
                        failed = item
                if item is _END:
                    ended = True
        finally:
            self.close()

    def close(self) -> None:
        self.stop.set()
        for t in self._threads + [t for w in self._workers for t in w.threads]:
            t.join(timeout=5)
        if self._gc_callback in gc.callbacks:
            gc.callbacks.remove(self._gc_callback)
        if self._gc_frozen:
            gc.unfreeze()
            self._gc_frozen = False
        if self._pinned is not None:
            self._pinned.close()

    def run(self, on_step=None) -> "StreamStats":
        """Run to the end (``on_step(step)`` for each); the figures."""
        for step in self:
            if on_step is not None:
                on_step(step)
        return self.stats()

    # -- figures ----------------------------------------------------------------------------------------
    def dropped(self) -> dict[str, int]:
        """Frames dropped per source (by its position among the sources)."""
        return {str(i): len(q.dropped) for i, q in enumerate(self.queues)}

    def stats(self) -> "StreamStats":
        return StreamStats.of(self.records, self.models, self.options, self.dropped(), self.gc_pauses, self.warmups)


def _record(step: StepResult) -> StepResult:
    """What the figures keep of a step: its times, not its images or results."""
    frames = [Frame(f.source, f.index, f.name, None, f.decode_ms, f.read_at) for f in step.frames]
    return StepResult(step.index, frames, {}, dict(step.times), step.dispatched, step.done)


def percentiles(samples) -> dict[str, float] | None:
    """p50/p95/p99 and mean of ``samples`` (milliseconds), rounded; None when there are none."""
    values = np.asarray([s for s in samples if s is not None], dtype=np.float64)
    if values.size == 0:
        return None
    out = {f"p{q}": round(float(np.percentile(values, q)), 3) for q in PERCENTILES}
    out["mean"] = round(float(values.mean()), 3)
    out["max"] = round(float(values.max()), 3)
    return out


@dataclass
class StreamStats:
    """The figures of a stream. Each model warms up on each new input shape before the step that brings it
    is dispatched, with nothing else in flight, so every step is timed as it runs."""

    steps: int
    frames: int
    warmups: int  # (model, input shape) warm-ups run, untimed
    fps: float | None  # frames per second: frames / (last result - first dispatch)
    frame_ms: dict | None  # per step: dispatch (frames decoded, taken from the queues) -> last result
    age_ms: dict | None  # per step: first frame read -> last result (decoding and queue waits included)
    decode_ms: dict | None  # per frame
    wait_ms: dict | None  # per step: last frame decoded -> dispatch (time spent in the queue)
    models: dict[str, dict]  # per model: runs, stage percentiles, latency percentiles
    dropped: dict[str, int]  # frames dropped per source
    gc: dict
    options: dict

    @classmethod
    def of(cls, steps: list[StepResult], models: list[str], options: StreamOptions, dropped, gc_pauses,
           warmups: int = 0):
        frames = sum(len(s.frames) for s in steps)
        ran = [s for s in steps if s.times]  # a step no model's cadence took has no latency
        fps = None
        if len(steps) >= 2:
            window = max(s.done for s in steps) - min(s.dispatched for s in steps)
            fps = round(frames / window, 2) if window > 0 else None
        per_model = {}
        for m in models:
            runs = [s.times[m] for s in steps if m in s.times]
            per_model[m] = {"runs": len(runs), **{f"{k}_ms": percentiles(getattr(t, k) for t in runs)
                                                  for k in (*STAGES, "latency")}}
        return cls(
            steps=len(steps), frames=frames, warmups=warmups, fps=fps,
            frame_ms=percentiles(s.latency_ms for s in ran), age_ms=percentiles(s.age_ms for s in ran),
            decode_ms=percentiles(f.decode_ms for s in steps for f in s.frames),
            wait_ms=percentiles((s.dispatched - max(f.read_at + f.decode_ms / 1e3 for f in s.frames)) * 1e3
                                for s in steps),
            models=per_model, dropped=dropped,
            gc={"held": options.hold_gc, "pauses": len(gc_pauses),
                "max_ms": round(max(gc_pauses), 3) if gc_pauses else 0.0,
                "total_ms": round(sum(gc_pauses), 3)},
            options={"drop": options.drop, "queue": options.queue, "every": dict(options.every),
                     "frames_per_step": options.frames_per_step, "batch": options.batch,
                     "in_flight": options.in_flight, "warmup": options.warmup, "pace": options.pace},
        )

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
