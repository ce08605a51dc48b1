"""The streaming pipeline (enginekit.runtime.stream): order, drops, cadence, batching, figures, failures.

Most tests run predictors whose stages sleep and whose result is the frame's own pixel value, so a
result out of order, on the wrong frame or from the wrong batch shows; one test streams a real YOLO
graph on ONNX Runtime and checks the stream gives what calling the predictor frame by frame gives.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from enginekit.errors import ModelFailed, UsageError
from enginekit.runtime.stream import DropQueue, Stream, StreamOptions, parse_every


@dataclass
class _Result:
    value: int
    timings: object = None
    source: str | None = None

    def __post_init__(self):
        from enginekit.results import Timings

        self.timings = Timings()


class _Processor:
    def input_hw(self, shape):
        return (8, 8)


class FakePredictor:
    """A predictor on the CPU whose stages sleep; a frame's result is its top-left pixel value."""

    def __init__(self, model, *, infer=0.005, pre=0.001, post=0.001, family="fake", fail_at=None, fail_in="infer"):
        from enginekit.backends.base import SessionInfo
        from enginekit.runtime.predictor import Predictor

        self.model, self.family = model, family
        self.info = SessionInfo("fake", "cpu", "x", ("y",), (None, 3, 8, 8), np.float32, None)
        self.processor = _Processor()
        self.pre, self.inf, self.post, self.fail_at, self.fail_in = pre, infer, post, fail_at, fail_in
        self.calls: list[list[int]] = []  # the frames of each inference call, by value
        self.lock = threading.Lock()
        self.chunks = Predictor.chunks.__get__(self)
        self.run_chunk = Predictor.run_chunk.__get__(self)

    def _maybe_fail(self, stage, values):
        if self.fail_in == stage and self.fail_at is not None and self.fail_at in values:
            raise RuntimeError(f"{self.model} broke on frame {self.fail_at} in {stage}")

    def preprocess_cpu(self, frames, hw, rgb=False):
        time.sleep(self.pre)
        x = np.array([int(f[0, 0, 0]) for f in frames])
        self._maybe_fail("pre", x.tolist())
        return x

    def infer_cpu(self, x):
        time.sleep(self.inf)
        self._maybe_fail("infer", x.tolist())
        with self.lock:
            self.calls.append(x.tolist())
        return {"y": x.copy()}

    def postprocess(self, outputs, shapes, hw):
        time.sleep(self.post)
        self._maybe_fail("post", outputs["y"].tolist())
        return [_Result(int(v)) for v in outputs["y"]]


def frames(n, *, start=0, h=12, w=20):
    """Non-square frames whose pixels hold their index."""
    return [(f"f{i}", np.full((h, w, 3), i % 256, np.uint8)) for i in range(start, start + n)]


def run(predictors, sources, **options):
    stream = Stream(predictors, sources, StreamOptions(**options), names=[p.model for p in predictors])
    steps = list(stream)
    return stream, steps


def values(step, model):
    return [r.value for r in step.results[model]]


def test_frames_stay_in_order_and_each_model_keeps_its_cadence():
    fast, slow = FakePredictor("yolo", infer=0.002), FakePredictor("depth", infer=0.02, family="depth-anything-v2")
    stream, steps = run([fast, slow], [frames(30)], every={"depth": 3}, warmup=1)
    assert [s.index for s in steps] == list(range(30))
    assert [values(s, "yolo") for s in steps] == [[i] for i in range(30)]
    assert [s.index for s in steps if "depth" in s.results] == list(range(0, 30, 3))
    assert all(values(s, "depth") == [s.index] for s in steps if "depth" in s.results)
    stats = stream.stats()
    assert stats.models["depth"]["runs"] == 10 and stats.models["yolo"]["runs"] == 30
    assert stats.fps and stats.fps > 0 and stats.frame_ms["p99"] >= stats.frame_ms["p50"] > 0
    assert stats.dropped == {"0": 0} and stats.warmups == 2  # each model warmed up once, on the one frame shape
    json.dumps(stats.to_json())  # the figures are JSON as they are


def test_a_model_named_by_its_family_takes_its_cadence_and_unknown_names_are_refused():
    depth = FakePredictor("depth-anything-v2-small", family="depth-anything-v2")
    stream, steps = run([depth], [frames(6)], every={"depth-anything-v2": 2}, warmup=0)
    assert [s.index for s in steps if s.results] == [0, 2, 4]
    with pytest.raises(UsageError, match="no such model"):
        Stream([depth], [frames(2)], StreamOptions(every={"yolo": 2}))


def test_drop_policies_under_overload():
    """A source at 100 frames/s into a model that takes 50 ms a frame, one frame of queue: none processes every
    frame; oldest and newest drop, oldest keeping the freshest frame (its frames wait little, and the last
    frame is processed), newest the frame that was waiting (its frames wait most of a model's run)."""
    runs = {}
    for policy in ("none", "oldest", "newest"):
        model = FakePredictor("m", infer=0.05, pre=0, post=0)
        stream, steps = run([model], [frames(20)], drop=policy, queue=1, in_flight=1, pace=100.0, warmup=0)
        done = [values(s, "m")[0] for s in steps]
        assert done == sorted(done) and len(set(done)) == len(done)  # in order, once each
        stats = stream.stats()
        assert stats.dropped["0"] + len(done) == 20
        runs[policy] = (done, stats)
    assert runs["none"][0] == list(range(20)) and runs["none"][1].dropped["0"] == 0
    assert runs["oldest"][1].dropped["0"] > 0 and runs["newest"][1].dropped["0"] > 0
    assert 19 in runs["oldest"][0]
    assert runs["newest"][1].wait_ms["mean"] > runs["oldest"][1].wait_ms["mean"]


def test_several_sources_are_batched_one_frame_of_each_per_step():
    model = FakePredictor("m")
    left, right = frames(5), frames(5, start=100)
    stream, steps = run([model], [left, right], warmup=0)
    assert [values(s, "m") for s in steps] == [[i, 100 + i] for i in range(5)]
    assert [[f.source for f in s.frames] for s in steps] == [[0, 1]] * 5
    assert model.calls == [[i, 100 + i] for i in range(5)]  # one inference call per step


def test_frames_per_step_and_batch():
    model = FakePredictor("m")
    stream, steps = run([model], [frames(7)], frames_per_step=3, batch=2, warmup=0)
    assert [values(s, "m") for s in steps] == [[0, 1, 2], [3, 4, 5], [6]]  # the last step: what was left
    assert model.calls == [[0, 1], [2], [3, 4], [5], [6]]


def test_the_stream_ends_with_its_shortest_source():
    model = FakePredictor("m")
    _, steps = run([model], [frames(6), frames(3, start=50)], warmup=0)
    assert [values(s, "m") for s in steps] == [[0, 50], [1, 51], [2, 52]]


def test_garbage_collector_is_held_while_the_stream_runs():
    before = gc.get_freeze_count()
    model = FakePredictor("m")
    stream = Stream([model], [frames(4)], StreamOptions(warmup=0))
    seen = [gc.get_freeze_count() for _ in stream]
    assert min(seen) > before  # the long-lived heap is out of the collector's reach while frames flow
    assert gc.get_freeze_count() == before and stream.stats().gc["held"]


def test_collections_during_warm_up_are_not_counted_as_the_streams_pauses():
    class Collecting(FakePredictor):
        def preprocess_cpu(self, frames, hw, rgb=False):
            gc.collect()  # a full collection in every call: warm-up runs and timed steps alike
            return super().preprocess_cpu(frames, hw, rgb)

    stream = Stream([Collecting("m")], [frames(2)], StreamOptions(warmup=3, hold_gc=False))
    gc.disable()  # only the explicit collections: an automatic one could take over 1 ms on a loaded machine
    try:
        list(stream)
    finally:
        gc.enable()
    assert stream.warmups == 1
    assert stream.stats().gc["pauses"] == 2  # the two timed steps' collections; the three warm-up runs' are not


class FakeGpuPredictor(FakePredictor):
    """The stream's GPU path (one thread: step N+1 submitted before step N is finished), run on the CPU."""

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        from enginekit.backends.base import SessionInfo

        self.info = SessionInfo("fake", "cuda:0", "x", ("y",), (None, 3, 8, 8), np.float32, None)

    def submit_gpu(self, frames, hw, rgb=False, *, keep_outputs=False):
        return self.infer_cpu(self.preprocess_cpu(frames, hw, rgb))

    def finish_gpu(self, outputs):
        return self.postprocess(outputs, None, None)


def test_a_gpu_model_warms_up_on_the_thread_that_queues_its_steps_with_the_runs_its_backend_needs():
    """ONNX Runtime's CUDA provider captures its graph on the third run of a shape on a thread and keeps it
    there, in a mode any other thread's CUDA call spoils: the stream runs those runs (``capture_runs``) on the
    thread that queues the model's timed steps too (the dispatching one: no hand-over before the network),
    before any timed step, even with --warmup 0; postprocessing runs on the model's own thread."""

    class Capturing(FakeGpuPredictor):
        def __init__(self, model, **kw):
            super().__init__(model, **kw)
            self.session = type("Session", (), {"capture_runs": 3})()
            self.threads_seen: list[tuple[str, int]] = []

            self.finished_on: list[str] = []

        def submit_gpu(self, frames, hw, rgb=False, *, keep_outputs=False):
            self.threads_seen.append((threading.current_thread().name, int(frames[0][0, 0, 0])))
            return super().submit_gpu(frames, hw, rgb, keep_outputs=keep_outputs)

        def finish_gpu(self, outputs):
            self.finished_on.append(threading.current_thread().name)
            return super().finish_gpu(outputs)

    model, other = Capturing("m"), FakeGpuPredictor("other")
    stream = Stream([model, other], [frames(4)], StreamOptions(warmup=0))
    assert [s.index for s in stream] == [0, 1, 2, 3]
    names = {name for name, _ in model.threads_seen}
    assert names == {"enginekit-stream-_dispatch"}, names  # warm-up and timed runs alike: one thread
    assert [v for _, v in model.threads_seen] == [0, 0, 0, 0, 1, 2, 3]  # three untimed runs of the shape first
    assert model.finished_on[3:] == ["enginekit-m-_gpu_loop"] * 4  # the timed steps' postprocessing: its own
    assert stream.warmups == 1  # the model that needs them; the other ran no warm-up (--warmup 0)


@pytest.mark.parametrize("path, stage", [("cpu", "pre"), ("cpu", "infer"), ("cpu", "post"), ("gpu", "infer"),
                                         ("gpu", "post")])
def test_a_failing_model_stops_the_stream_with_its_error(path, stage):
    """The steps before the failing one are given, then its error. The other model is slower: when the failure
    comes those steps are still in flight. ``gpu``: the one-thread GPU path (step N+1 submitted before step N
    is finished), run on the CPU."""
    kind = FakePredictor if path == "cpu" else FakeGpuPredictor
    ok, broken = kind("ok", infer=0.03), kind("broken", fail_at=5, fail_in=stage)
    stream = Stream([ok, broken], [frames(40)], StreamOptions(warmup=0))
    got = []
    with pytest.raises(ModelFailed, match=f"broken failed on f5: RuntimeError: broken broke on frame 5 in {stage}") as caught:
        for step in stream:
            got.append(step.index)
            assert values(step, "ok") == values(step, "broken") == [step.index]
    assert got == list(range(5))  # every step before the failing one, none after
    assert isinstance(caught.value.__cause__, RuntimeError) and caught.value.step == 5
    assert not any(t.is_alive() for t in stream._threads + [t for w in stream._workers for t in w.threads])


@pytest.mark.parametrize("path", ["cpu", "gpu"])
@pytest.mark.parametrize("warmup", [0, 1])
@pytest.mark.parametrize("count", [1, 3])
def test_a_model_failing_on_its_first_frame_is_an_error_not_an_empty_stream(path, warmup, count):
    """The first frame of a shape is where a model meets its input (a graph refusing the size); with a warm-up
    the failure comes from the warm-up, which runs on the dispatching thread (CPU) or the model's (GPU). The
    stream raises it; it never ends quietly with nothing found."""
    kind = FakePredictor if path == "cpu" else FakeGpuPredictor
    stream = Stream([kind("broken", fail_at=0)], [frames(count)], StreamOptions(warmup=warmup))
    with pytest.raises(ModelFailed, match="broken failed on f0: RuntimeError: broken broke on frame 0"):
        list(stream)
    assert stream.records == []


def test_options_and_every_are_checked():
    assert parse_every(["depth=3", "yolo=1,seg=2"]) == {"depth": 3, "yolo": 1, "seg": 2}
    for bad in (["depth"], ["depth=0"], ["=2"], ["depth=x"]):
        with pytest.raises(UsageError, match="--every"):
            parse_every(bad)
    for options in ({"drop": "latest"}, {"queue": 0}, {"frames_per_step": 0}, {"in_flight": 0}, {"pace": 0},
                    {"batch": 0}):
        with pytest.raises(UsageError):
            StreamOptions(**options)


def test_drop_queue_policies_directly():
    stop = threading.Event()
    from enginekit.runtime.stream import Frame

    for policy, kept in (("oldest", [2, 3]), ("newest", [0, 1])):
        q = DropQueue(2, policy)
        for i in range(4):
            q.put(Frame(0, i, str(i), None, 0.0, 0.0), stop)
        q.close()
        assert [q.get(stop).index for _ in range(2)] == kept and q.get(stop) is None
        assert sorted(q.dropped) == sorted({0, 1, 2, 3} - set(kept))


def test_the_decoder_is_woken_once_the_step_is_given_not_when_its_frame_is_taken():
    """The dispatcher takes a step's frames without waking the decoder waiting for room (``get(wake=False)``), so
    that it takes no share of the interpreter while the step's GPU work is queued; ``room()`` wakes it after. A
    dispatcher that needs another frame from the queue (several frames per step) wakes it first, before it waits."""
    from enginekit.runtime.stream import Frame

    class Counting(threading.Condition):
        wakes = 0

        def notify_all(self):
            Counting.wakes += 1
            super().notify_all()

    stop = threading.Event()
    q = DropQueue(1, "none")
    q.cond = Counting()
    q.put(Frame(0, 0, "0", None, 0.0, 0.0), stop)
    base = Counting.wakes
    assert q.get(stop, wake=False).index == 0 and Counting.wakes == base  # taken; the decoder not woken
    q.room()
    q.room()
    assert Counting.wakes == base + 1  # woken once, by the first
    q.put(Frame(0, 1, "1", None, 0.0, 0.0), stop)
    assert q.get(stop, wake=False).index == 1
    woken = Counting.wakes

    waiting, woke = threading.Event(), []

    def decoder():  # gives the next frame once woken (or after 5 s)
        with q.cond:
            waiting.set()
            woke.append(q.cond.wait(5))
        q.put(Frame(0, 2, "2", None, 0.0, 0.0), stop)

    t = threading.Thread(target=decoder, daemon=True)
    t.start()
    assert waiting.wait(5)
    with q.cond:  # the decoder holds the lock from ``waiting`` until its wait: it is waiting now
        pass
    got = q.get(stop, wake=False)  # the queue is empty: the owed wake comes first, then the frame
    t.join(10)
    assert got is not None and got.index == 2 and woke == [True] and Counting.wakes > woken
    q.room()  # nothing owed after the wait's own wake: no further wake needed, the call is harmless
    q.put(Frame(0, 3, "3", None, 0.0, 0.0), stop)
    assert q.get(stop).index == 3  # the default still wakes at once


# -- a real graph: the stream gives what the predictor gives frame by frame ------------------------------------
def _clip(folder, detector_images, frames: int = 6):
    """An MJPG video of ``frames`` 320x240 (non-square) frames of the held-out shape images, each shifted."""
    import cv2

    shapes = sorted(p for p in detector_images.iterdir() if p.name.startswith("shapes"))[:3] or \
        sorted(detector_images.iterdir())[:3]
    video = folder / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (320, 240))
    for i in range(frames):
        image = cv2.imread(str(shapes[i % len(shapes)]))
        writer.write(cv2.resize(np.roll(image, 17 * i, axis=1), (320, 240)))
    writer.release()
    return video


def _per_frame(predictor, video):
    import cv2

    cap = cv2.VideoCapture(str(video))
    direct = []
    while True:
        ok, frame = cap.read()
        if not ok:
            return direct
        direct.append(predictor(frame))


def _assert_same_detections(streamed, direct, box_atol, score_atol):
    assert len(direct) == len(streamed) == 6 and sum(len(d) for d in direct) >= 6  # it finds the shapes
    for got, want in zip(streamed, direct):
        assert got.image_shape == (240, 320) and len(got) == len(want)
        np.testing.assert_allclose(got.boxes, want.boxes, atol=box_atol)
        np.testing.assert_allclose(got.scores, want.scores, atol=score_atol)
        assert list(got.class_ids) == list(want.class_ids) and got.timings.infer > 0


def test_stream_of_a_real_detector_equals_calling_it_per_frame(tmp_path, cache, trained_detector, detector_images):
    """The suite's trained detector at 320x320 on ONNX Runtime, over a video of its held-out shape images in
    non-square frames: every streamed frame's detections equal the predictor's own on that frame, in order,
    with two steps in flight."""
    from enginekit.flows.load import load
    from enginekit.runtime.sources import open_source

    video = _clip(tmp_path, detector_images)
    predictor = load(trained_detector.model, backend="onnxruntime-cpu", weights=trained_detector.weights,
                     input_size=320, cache=cache)
    stream = Stream([predictor], [open_source(str(video))], StreamOptions(in_flight=2, warmup=1))
    streamed = [(s.frames[0].name, s.results[predictor.model][0]) for s in stream]
    assert [name for name, _ in streamed] == [f"clip:{i}" for i in range(6)]
    _assert_same_detections([r for _, r in streamed], _per_frame(predictor, video), 1e-3, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["onnxruntime-cuda", "torch"])
def test_stream_on_a_gpu_equals_calling_it_per_frame(backend, tmp_path, cache, trained_detector, detector_images):
    """The GPU path (each model on its own CUDA stream, the next step queued before this one is
    postprocessed, outputs copied out of reused buffers): the trained detector beside yolo12n on every second
    step, two steps in flight; the detector's streamed detections equal its own per frame, in order."""
    from enginekit.flows.load import load
    from enginekit.runtime.sources import open_source

    video = _clip(tmp_path, detector_images)
    detector = load(trained_detector.model, backend=backend, weights=trained_detector.weights, input_size=320,
                    cache=cache)
    other = load("yolo12n", backend=backend, random_init=True, input_size=320, cache=cache)
    assert detector.info.on_gpu and other.info.on_gpu
    stream = Stream([detector, other], [open_source(str(video))],
                    StreamOptions(in_flight=2, warmup=1, every={"yolo12n": 2}))
    steps = list(stream)
    assert [s.frames[0].name for s in steps] == [f"clip:{i}" for i in range(6)]
    assert [other.model in s.results for s in steps] == [True, False] * 3
    stats = stream.stats().to_json()
    assert stats["models"][other.model]["runs"] == 3 and stats["models"][detector.model]["runs"] == 6
    _assert_same_detections([s.results[detector.model][0] for s in steps], _per_frame(detector, video), 1e-2, 1e-3)


# -- the commands --------------------------------------------------------------------------------------------
def test_predict_streams_a_video_with_a_cadence_and_reports_its_figures(run_cli, tmp_path):
    """predict on a video, two models, one every second step: --json gives every stage's percentiles; --save
    writes a result per frame for each model on the steps it ran."""
    from enginekit.images import write_video

    video = write_video(tmp_path / "v.mp4", 4, (180, 320))
    r = run_cli("predict", "yolo12n,yolov8n", str(video), "--random-init", "--backend", "onnxruntime-cpu",
                "--every", "yolov8n=2", "--json", "--save", str(tmp_path / "out"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    summary, stats = data["summary"], data["summary"]["stream"]
    assert summary["frames"] == 4 and stats["steps"] == 4 and len(data["frames"]) == 4
    assert [sorted(f["results"]) for f in data["frames"]] == [["yolo12n", "yolov8n"], ["yolo12n"]] * 2
    assert stats["models"]["yolo12n"]["runs"] == 4 and stats["models"]["yolov8n"]["runs"] == 2
    for model in ("yolo12n", "yolov8n"):
        for stage in ("preprocess_ms", "infer_ms", "postprocess_ms", "latency_ms"):
            f = stats["models"][model][stage]
            assert 0 < f["p50"] <= f["p95"] <= f["p99"], (model, stage, f)
    assert stats["frame_ms"]["p50"] >= stats["models"]["yolo12n"]["infer_ms"]["p50"]
    assert (tmp_path / "out" / "results.json").is_file()


def test_bench_stream_rows_each_model_alone_and_the_pair(run_cli):
    """bench --stream on the graphs the test above exported (the default input): a row per model alone (every
    step) and one for the pair (yolov8n every second step)."""
    r = run_cli("bench", "yolo12n,yolov8n", "--random-init", "--backend", "onnxruntime-cpu",
                "--warmup", "1", "--iters", "4", "--stream", "--every", "yolov8n=2", "--json",
                env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.code == 0, r.stderr
    stream = json.loads(r.stdout)["stream"]
    rows = {tuple(row["models"]): row for row in stream["results"]}
    assert set(rows) == {("yolo12n",), ("yolov8n",), ("yolo12n", "yolov8n")}
    for models, row in rows.items():
        assert row["status"] == "ok" and row["backend"] == "onnxruntime-cpu" and row["fps"] > 0, row
        assert 0 < row["frame_ms"]["p50"] <= row["frame_ms"]["p95"] <= row["frame_ms"]["p99"]
        runs = {m: v["runs"] for m, v in row["stats"]["models"].items()}
        # 5 frames; alone a model runs on every step, in the pair yolov8n on every second one
        assert runs == ({"yolo12n": 5, "yolov8n": 3} if len(models) == 2 else {models[0]: 5}), runs


def test_stereo_segmenter_one_batch_of_two_per_step(run_cli, tmp_path):
    """The VR service's shape on the CPU: a declared segmenter, two videos (left and right eye), one inference
    call of a batch of 2 per step, a class map per eye at the eye's own size."""
    import cv2

    rng = np.random.default_rng(0)
    for name in ("left", "right"):
        writer = cv2.VideoWriter(str(tmp_path / f"{name}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 30, (128, 96))
        for _ in range(6):
            writer.write(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8))
        writer.release()
    r = run_cli("predict", "torchvision:lraspp_mobilenet_v3_large", "--random-init", "--classes", "3", "--size",
                "64x64", "left.mp4", "right.mp4", "--json")
    assert r.code == 0, r.stderr
    doc = json.loads(r.stdout)
    stream = doc["summary"]["stream"]
    assert stream["frames"] == 12 and stream["steps"] == 6  # both eyes in every step
    (model,) = stream["models"].values()
    assert model["runs"] == 6  # one inference call per step: the two eyes batched
    sources = {f["source"].split(":")[0] for f in doc["frames"]}
    assert sources == {"left", "right"}
    for frame in doc["frames"]:
        (result,) = frame["results"].values()
        assert result["kind"] == "semantic" and result["image_shape"] == [96, 128]


def test_the_python_api_predicts_what_the_command_does(run_cli, tmp_path):
    """``enginekit.predict`` (a PredictRequest, as every other verb) finds on a photograph what ``enginekit predict
    --json`` finds: the same labels and boxes, the run's events collected."""
    import enginekit
    from ultralytics.utils import ASSETS

    photo = str(ASSETS / "zidane.jpg")
    outcome = enginekit.predict("yolo12n", photo, random_init=True, backend="onnxruntime-cpu", quiet=True)
    (record,) = outcome.records
    found = record["results"]["yolo12n"]
    r = run_cli("predict", "yolo12n", photo, "--random-init", "--backend", "onnxruntime-cpu", "--json")
    assert r.code == 0, r.stderr
    (cli,) = json.loads(r.stdout)["frames"]
    assert found["found"] == cli["results"]["yolo12n"]["found"] and found["found"] != "nothing"
    theirs = cli["results"]["yolo12n"]["detections"]
    assert [d["class_id"] for d in found["detections"]] == [d["class_id"] for d in theirs]
    assert np.allclose([d["box"] for d in found["detections"]], [d["box"] for d in theirs], atol=0.01)
    assert outcome.events and outcome.document["frames"][0]["results"]["yolo12n"]["found"] == found["found"]


class _GpuStandIn(FakePredictor):
    """A predictor that looks like one on a GPU: ``submit_gpu`` (the dispatching thread) and ``finish_gpu`` (the
    model's own) log their step in ``log``; a submission takes ``submit_s``."""

    def __init__(self, model, log, submit_s=0.0):
        from enginekit.backends.base import SessionInfo

        super().__init__(model)
        self.info = SessionInfo("fake", "cuda:0", "x", ("y",), (None, 3, 8, 8), np.float32, None)
        self.log, self.submit_s = log, submit_s

    def submit_gpu(self, frames, hw, rgb=False, *, keep_outputs=False):
        time.sleep(self.submit_s)
        value = int(frames[0][0, 0, 0])
        self.log.append(("submit", self.model, value))
        return value

    def launch_bound(self, frames):
        self.log.append(("launch", self.model, int(frames[0][0, 0, 0])))
        return True

    def finish_gpu(self, value):
        self.log.append(("finish", self.model, value))
        return [_Result(value)]


@pytest.mark.parametrize("dispatch", ["launch", "after", "each"])
def test_on_a_gpu_every_models_step_is_queued_before_any_models_thread_is_woken(monkeypatch, dispatch):
    """A model's thread woken while the dispatching thread still queues the next model's step takes the interpreter
    from it (the next network starts later): the step goes to the models' threads once all are queued, and (``launch``)
    each graph that holds the step's frames already is launched before any submission; the caller's thread is woken
    once per step, when every model has answered. ``each`` (the way before, kept for before/after measurements) shows
    the comparison sees the other order."""
    import enginekit.runtime.stream as stream_module

    monkeypatch.setattr(stream_module, "pool_for", lambda predictors: None)  # no pinned memory on any machine
    log: list = []
    first, second = _GpuStandIn("a", log), _GpuStandIn("b", log, submit_s=0.03)
    stream = Stream([first, second], [frames(4)], StreamOptions(in_flight=1, warmup=0, hold_gc=False))
    stream.dispatch = dispatch
    woken: list = []
    put = stream.done.put
    stream.done.put = lambda item: (woken.append(item), put(item))[1]
    steps = list(stream)
    assert sorted(i for i in woken if isinstance(i, int)) == [0, 1, 2, 3], "the caller woken once a step, when complete"
    assert [values(s, "a") for s in steps] == [[i] for i in range(4)]
    assert [values(s, "b") for s in steps] == [[i] for i in range(4)]
    for i in range(4):
        order = [(what, model) for what, model, value in log if value == i]
        launches = [("launch", "a"), ("launch", "b")] if dispatch == "launch" else []
        assert sorted(order) == [("finish", "a"), ("finish", "b"), *launches, ("submit", "a"), ("submit", "b")]
        assert order[:len(launches)] == launches, "the graphs holding the step's frames launched before any submission"
        queued_first = order.index(("submit", "b")) < order.index(("finish", "a"))
        assert queued_first is (dispatch != "each"), (i, order)
