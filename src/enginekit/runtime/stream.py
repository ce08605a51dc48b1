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
stage's and the whole step's p50/p95/p99 and frames per second. This module schedules; the queues frames
wait in are ``stream_queues``, a model's stage work ``stream_worker``, what a run records and its figures
``stream_records``. What keeps the figures steady: each model warms up on every new input shape before the step that brings it is dispatched, with nothing
else in flight (ONNX Runtime's arena, cuDNN's algorithm choice, the CUDA graphs preprocessing and
ORT capture are made then, untimed), Python's garbage collector is held off the
long-lived heap while the stream runs (``gc.freeze``: with torch and Ultralytics loaded a full
collection walks about 200,000 objects, 0.2 to 0.8 s on a 2-core x86-64 CPU machine; what the
run keeps is frozen again every 64 steps), and pinned
host buffers and CUDA events are made once per frame shape and reused. Nothing here prints.
"""

from __future__ import annotations

import contextlib
import gc
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from enginekit.errors import UsageError
from enginekit.runtime.pinned import pool_for
from enginekit.runtime.stream_queues import _END, DROP_POLICIES, DropQueue, _put
from enginekit.runtime.stream_records import (PERCENTILES, STAGES, Frame, ModelTimes, StepResult,  # noqa: F401
                                              StreamStats, _record, percentiles)
from enginekit.runtime.stream_worker import _STOP_WORKER, _Failure, _model_failed, _Worker

#: while the collector is held, what the stream and its caller keep (results, records) is frozen every this
#: many steps, so a long run's full collections never walk it either (gc.freeze only moves lists: O(1))
REFREEZE_EVERY = 64


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
        self.bind_ahead = True  # the next step's frames copied into the graphs' inputs ahead (``_upload_ahead``)
        # how a step is given to its models (``_give``): "launch" (bound graphs launched, then every model's work
        # queued, then their threads woken), "after" (no launch first), "each" (each model's work queued and its
        # thread woken in turn: the way before, for before/after measurements)
        self.dispatch = "launch"
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
                # no CUDA call here: the dispatching thread uploads the frames that wait (``_upload_ahead``)
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
        # (one model: ``serving``); with several, in inference mode all along (entered once, not per submission),
        # each submission entering only its model's stream
        gpu = [p for p in self.predictors if p.info.on_gpu]
        serving = getattr(gpu[0], "serving", None) if len(gpu) == 1 else None
        if serving is None and gpu:
            import torch

            serving = torch.inference_mode
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
                    if not self._give(step, [w for w in self._workers if w.predictor.model in due]):
                        return
                finally:
                    for q in self.queues:  # the decoders go on now: the step's GPU work is queued
                        q.room()
                index += 1
                self._upload_ahead(index)
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

    def _give(self, step: StepResult, takers: list) -> bool:
        """Give ``step`` to the models due on it (``dispatch``): on a GPU, every graph that holds the step's frames
        already is launched first, then each model's work queued, then each model's thread woken (a thread woken
        between two submissions takes the interpreter from this one while it queues the next model's network).
        False when the stream stopped."""
        if self.dispatch == "each":
            return all(w.send(step) for w in takers)
        if self.dispatch == "launch":
            for w in takers:
                w.launch(step)
        items = [(w, w.submit(step)) for w in takers]
        return all(w.hand(item) for w, item in items)

    def _upload_ahead(self, index: int) -> None:
        """The frames waiting in the queues, copied to the GPU now, while the step just queued runs there. The next
        step's frames go straight into the input of the graph each model on a GPU will replay for it
        (``_Worker.bind_ahead``: no copy or wait left for that step's dispatch); the others, and any frame a model
        could not take so, once to the device, where a model that takes the whole frame finds them
        (``pinned.on_device``). Measured on an H200 machine (yolo12n alone on a 1080p video, one step in flight):
        the frame bound ahead, a step's latency p50 1.34 ms against 1.49 (its dispatch a replay: no device copy to
        look up, wait for and copy into the graph's input). Here, not on the decoding thread: its CUDA calls through
        torch each hand the interpreter to the other threads and back while a step waits for it (the decoder's time
        between two reads 0.38 -> 0.10 ms, the step's p50 0.016 ms less)."""
        if self._pinned is None or self._pinned.device is None:
            return
        waiting = [q.waiting() for q in self.queues]
        k, bound = self.options.frames_per_step, set()
        if self.bind_ahead and waiting and all(len(w) >= k for w in waiting):
            images = [f.image for w in waiting for f in w[:k]]
            takers = [w for w in self._workers
                      if w.predictor.info.on_gpu and index % self.every[w.predictor.model] == 0]
            if takers and all([w.bind_ahead(images, self._pinned) for w in takers]):
                bound = {id(i) for i in images}
        for frames in waiting:
            for f in frames:
                if id(f.image) not in bound and self._whole_frame_on_device(f.image):
                    self._pinned.upload(f.image)  # once per frame: a frame uploaded already is left

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
            due = self._due[step.index]
            due.discard(model)
            complete = not due
        if complete:  # the caller's thread woken once the step is complete, not by each model: a thread woken for
            self.done.put(step.index)  # nothing takes the interpreter while another model still finishes the step

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


