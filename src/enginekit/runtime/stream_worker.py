"""One model's stages in a stream (``_Worker``): on the CPU a thread per stage (preprocess, infer, postprocess)
so that stages of consecutive steps overlap; on a GPU the dispatching thread queues a step's upload,
preprocessing and network on the model's CUDA stream and the model's own thread postprocesses in order. A
model's failure is carried to the caller with the step it failed on."""

from __future__ import annotations

import contextlib
import queue
import threading
import time

from enginekit.errors import EnginekitError, ModelFailed
from enginekit.runtime.stream_queues import _END, _get, _put
from enginekit.runtime.stream_records import ModelTimes, StepResult



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



class _Worker:
    """One model's stages over the steps it is given; answers ``(step, model, results, times)``."""

    def __init__(self, predictor, options, answer, stop: threading.Event, fail, turn=None):
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
        return self._images_key([f.image for f in step.frames])

    def _images_key(self, images: list) -> tuple:
        return tuple((tuple(hw), tuple(tuple(images[i].shape) for i in idx)) for hw, idx in self.chunks(images))

    def send(self, step: StepResult) -> bool:
        """Give ``step`` to this model: ``hand(submit(step))``. False when the stream stopped."""
        return self.hand(self.submit(step))

    def submit(self, step: StepResult):
        """What this model's thread is to be given for ``step`` (on the dispatching thread). A GPU model's work is
        queued on the GPU here, at once: its thread is woken (``hand``) only to finish it (postprocessing), while
        the GPU runs the network; the frame's way to the network takes no hand-over between threads. Every session
        call of a GPU model, warm-ups included, is made from this one thread: ONNX Runtime's CUDA provider keeps a
        captured graph per thread. A model on the CPU: the step itself (its threads do the rest)."""
        if not self.predictor.info.on_gpu:
            return step
        p, o = self.predictor, self.options
        images = [f.image for f in step.frames]
        times = ModelTimes()
        try:
            with _on_step(step):
                chunks = self.chunks(images)
                keep = self._keep(chunks)
                return (step, times, [(idx, p.submit_gpu([images[i] for i in idx], hw, o.rgb, keep_outputs=keep))
                                      for hw, idx in chunks])
        except _StepFailed as failed:  # raised by the model's thread once the steps before it are finished
            return failed

    def launch(self, step: StepResult) -> None:
        """Replay now the graph of this model's step whose input holds the step's frames already (bound ahead:
        ``Predictor.launch_bound``), ahead of ``submit``, which then does the rest; nothing where there is none."""
        p = self.predictor
        if not p.info.on_gpu:
            return
        images = [f.image for f in step.frames]
        chunks = self.chunks(images)
        if len(chunks) == 1:
            try:
                p.launch_bound([images[i] for i in chunks[0][1]])
            except Exception:  # noqa: BLE001 - ``submit`` meets it again and gives it with its step
                pass

    def hand(self, item) -> bool:
        """Give ``submit``'s item to this model's thread(s); False when the stream stopped."""
        return _put(self.inbox, item, self.stop)

    def bind_ahead(self, images: list, pool) -> bool:
        """Copy the next step's ``images`` (waiting in the queues) straight into the input of the graph this model's
        step will replay (``Predictor.bind_ahead``), on the dispatching thread while the step before runs; False
        where it will not replay one (a new shape still to warm up on, a step of several calls)."""
        p = self.predictor
        if not p.info.on_gpu or self._images_key(images) not in self.seen:
            return False
        chunks = self.chunks(images)
        if len(chunks) != 1:
            return False
        hw, idx = chunks[0]
        return p.bind_ahead([images[i] for i in idx], hw, self.options.rgb, pool, keep_outputs=self._keep(chunks))

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


