"""A whole step as one CUDA graph (``runtime.step_graph``) and the stream's uploads ahead of a step: what a CPU can
check (the capture's bookkeeping with a stand-in for the capture, the torch backend's refusals, the stream's
uploads), and on a GPU the detector's results with and without the step's graph."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from enginekit.runtime import step_graph
from enginekit.runtime.step_graph import capture_step


class _Graph:
    """A stand-in for a captured graph: ``replay`` runs the step again and writes its answer into the outputs the
    capture gave (a real graph rewrites its own tensors in place)."""

    def __init__(self, fn, outputs):
        self.fn, self.outputs, self.replays = fn, outputs, 0

    def replay(self):
        self.replays += 1
        for k, v in self.fn().items():
            self.outputs[k].copy_(v)


def _capture(fn, device):
    """``capture_graph``'s shape: one run before the capture, then the captured run."""
    fn()
    step_graph_capturing[0] = True
    try:
        out = fn()
    finally:
        step_graph_capturing[0] = False
    return _Graph(fn, out), out


step_graph_capturing = [False]


@pytest.fixture
def capturing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: step_graph_capturing[0])
    recorded = []
    monkeypatch.setattr(step_graph, "timing_events", lambda n: [types.SimpleNamespace(
        record=lambda i=i: recorded.append(i)) for i in range(n)])
    return recorded


def _frame(seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (6, 10, 3), dtype=np.uint8))


def _preprocess(static_in):
    return static_in[0].permute(2, 0, 1).float().div(255)[None]


def test_the_graph_reads_each_steps_frames_and_its_events_are_recorded_inside(capturing):
    seen = []

    def forward(x):
        seen.append(x)
        return lambda: {"y": x * 2 + 1}

    entry = capture_step([_frame(0)], _preprocess, forward, None, _capture, "cpu")
    assert entry is not None and entry.spec is None and entry.hosts == []
    assert capturing == [0, 1, 2], "start, preprocessed, inferred: recorded while capturing only"
    assert len(entry.events) == 3 and entry.done is entry.events[-1]
    for seed in (1, 2):  # each step's frames copied in before the replay: the outputs follow them
        frame = _frame(seed)
        entry.replay([frame])
        want = _preprocess([frame]) * 2 + 1
        assert torch.equal(entry.outputs["y"], want)
    assert not torch.equal(_preprocess([_frame(1)]), _preprocess([_frame(2)])), "the check compares two frames"
    assert entry.keeps is not None, "the session's function stays with the graph (what it reads)"


def test_a_decode_is_planned_once_and_its_rows_copied_to_host_buffers(capturing, monkeypatch):
    plans = []

    class Spec:
        def run(self, outputs):
            return [outputs["y"].flatten()[:4].clone()]

    def plan(outputs):
        plans.append(outputs)
        return Spec()

    monkeypatch.setattr(torch, "empty", lambda shape, dtype=None, pin_memory=False, **kw: torch.zeros(
        shape, dtype=dtype, **kw))  # no pinned memory on a machine without a GPU
    entry = capture_step([_frame(0)], _preprocess, lambda x: (lambda: {"y": x + 0}), plan, _capture, "cpu")
    assert len(plans) == 1, "the decode is what the run before the capture planned"
    assert capturing == [0, 1, 2, 3] and len(entry.events) == 4
    frame = _frame(5)
    entry.replay([frame])
    assert np.array_equal(entry.arrays[0], _preprocess([frame]).flatten()[:4].numpy())


def test_a_session_that_cannot_run_inside_the_graph_or_a_refused_capture_gives_none(capturing):
    assert capture_step([_frame(0)], _preprocess, lambda x: None, None, _capture, "cpu") is None

    def refused(fn, device):
        raise RuntimeError("operation not permitted when stream is capturing")

    assert capture_step([_frame(0)], _preprocess, lambda x: (lambda: {"y": x}), None, refused, "cpu") is None


def test_the_torch_backend_offers_its_forward_only_for_shapes_it_captured():
    from enginekit.backends.pytorch import Torch

    session = Torch.__new__(Torch)
    session.cuda_graph, session._graphs = False, {}
    x = torch.zeros(1, 3, 8, 8)
    assert session.forward_in_graph(x) is None, "no CUDA graphs here (a CPU)"
    session.cuda_graph = True
    assert session.forward_in_graph(x) is None, "no graph of this shape yet"
    session._graphs[x.shape] = None  # its capture failed: the module copies from the host
    assert session.forward_in_graph(x) is None
    from enginekit.backends.base import Backend

    assert Backend.forward_in_graph is None, "other sessions run their own way"


def _waiting(frames):
    from enginekit.runtime.stream_queues import DropQueue
    from enginekit.runtime.stream_records import Frame

    q = DropQueue(4, "none")
    stop = types.SimpleNamespace(is_set=lambda: False)
    for i, image in enumerate(frames):
        q.put(Frame(0, i, str(i), image, 0.0, 0.0), stop)
    return q


def _gpu_worker(model: str, answer: bool, seen: list):
    predictor = types.SimpleNamespace(info=types.SimpleNamespace(on_gpu=True), model=model)
    return types.SimpleNamespace(predictor=predictor,
                                 bind_ahead=lambda images, pool: seen.append([id(i) for i in images]) or answer)


def test_the_dispatching_thread_uploads_the_frames_that_wait_once_each():
    from enginekit.runtime.stream import Stream

    uploads = []
    frames = [np.zeros((4, 6, 3), np.uint8), np.zeros((2, 2), np.uint8), np.zeros((4, 6, 3), np.uint8)]
    q = _waiting(frames)
    host = types.SimpleNamespace(
        _pinned=types.SimpleNamespace(device="cuda:0", upload=lambda image: uploads.append(id(image))),
        queues=[q], _whole_frame_on_device=lambda image: image.ndim == 3, bind_ahead=False, _workers=[],
        options=types.SimpleNamespace(frames_per_step=1), every={})
    Stream._upload_ahead(host, 1)
    assert uploads == [id(frames[0]), id(frames[2])], "the waiting frames a GPU model takes whole, in order"
    assert [f.index for f in q.waiting()] == [0, 1, 2], "left waiting"
    host._pinned.device = None  # several GPUs: no device to copy to ahead
    Stream._upload_ahead(host, 1)
    assert len(uploads) == 2


def test_the_next_steps_frame_goes_into_the_graphs_input_of_every_model_due_and_the_rest_to_the_device():
    from enginekit.runtime.stream import Stream

    uploads, seen = [], []
    frames = [np.zeros((4, 6, 3), np.uint8), np.ones((4, 6, 3), np.uint8)]
    host = types.SimpleNamespace(
        _pinned=types.SimpleNamespace(device="cuda:0", upload=lambda image: uploads.append(id(image))),
        queues=[_waiting(frames)], _whole_frame_on_device=lambda image: True, bind_ahead=True,
        _workers=[_gpu_worker("a", True, seen), _gpu_worker("b", True, seen)],
        options=types.SimpleNamespace(frames_per_step=1), every={"a": 1, "b": 2})
    Stream._upload_ahead(host, 4)  # both due on step 4
    assert seen == [[id(frames[0])]] * 2, "each model due on the next step binds its frame"
    assert uploads == [id(frames[1])], "bound by every model: not uploaded besides; the frame after it is"
    seen.clear(), uploads.clear()
    Stream._upload_ahead(host, 3)  # only a is due on step 3
    assert seen == [[id(frames[0])]] and uploads == [id(frames[1])]
    seen.clear(), uploads.clear()
    host._workers[0] = _gpu_worker("a", False, seen)  # a model that could not bind it: the frame goes up as before
    Stream._upload_ahead(host, 4)
    assert uploads == [id(frames[0]), id(frames[1])]
    seen.clear(), uploads.clear()
    host.bind_ahead = False
    Stream._upload_ahead(host, 4)
    assert seen == [] and uploads == [id(frames[0]), id(frames[1])]
    host.bind_ahead, host.options.frames_per_step = True, 3  # the next step's frames are not all here yet
    Stream._upload_ahead(host, 4)
    assert seen == []


class _Lent:
    """Frames as if lent by a stream's pinned pool (``pinned._LENT`` entries over ordinary memory)."""

    def __init__(self, *frames):
        from enginekit.runtime import pinned

        self.pinned, self.tensors = pinned, [torch.from_numpy(f) for f in frames]
        for t in self.tensors:
            pinned._LENT[t.data_ptr()] = [t, None, None, 1]

    def lend_again(self, i: int) -> None:
        self.pinned._LENT[self.tensors[i].data_ptr()][3] += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for t in self.tensors:
            self.pinned._LENT.pop(t.data_ptr(), None)


def _binding_predictor():
    """A predictor on a (stand-in) GPU with one captured step graph for 4x6 frames, its replays and copies seen."""
    from enginekit.runtime.predictor import Predictor
    from enginekit.runtime.step_graph import StepGraph

    calls = []
    info = types.SimpleNamespace(on_gpu=True, device="cuda:0", backend="torch", max_batch=None)
    session = types.SimpleNamespace(info=info, stream=None, forward_in_graph=lambda x: None)
    processor = types.SimpleNamespace(gpu_graphable=True, input_hw=lambda hw: (8, 8))
    p = Predictor(session, processor, model="m", family="f", reason="", precision="fp16", source="")
    p.stream = types.SimpleNamespace(wait_event=lambda e: calls.append(("wait", e)))
    graph = types.SimpleNamespace(replay=lambda: calls.append(("replay",)))
    entry = StepGraph([torch.zeros(4, 6, 3, dtype=torch.uint8)], graph, {}, ["start", "read"])
    entry.replay = lambda tensors: calls.append(("copy+replay", [t.data_ptr() for t in tensors]))
    key = p._step_key([np.zeros((4, 6, 3), np.uint8)], [(4, 6)], (8, 8), False)
    p._step_graphs[key] = entry
    return p, entry, calls


def test_a_frame_bound_ahead_replays_its_step_graph_with_no_copy_and_any_other_frame_is_copied_in():
    p, entry, calls = _binding_predictor()
    cuda = types.SimpleNamespace(type="cuda")
    frame, other = np.full((4, 6, 3), 7, np.uint8), np.full((4, 6, 3), 9, np.uint8)
    copies = []
    pool = types.SimpleNamespace(copy_into=lambda f, dest, after: copies.append((f, dest, after)) or "done")
    with _Lent(frame, other) as lent:
        assert p.bind_ahead([frame], (8, 8), False, pool)
        assert len(copies) == 1 and copies[0][0] is frame and copies[0][1] is entry.static_in[0]
        assert copies[0][2] == "read", "after the last replay has read the graph's input"
        assert calls == [("wait", "done")], "the predictor's stream waits for the copy"
        calls.clear()
        assert p._step_graph([frame], [(4, 6)], (8, 8), False, cuda, None, []) is entry
        assert calls == [("replay",)], "no copy: the graph's input holds the frame"
        calls.clear()
        assert p._step_graph([frame], [(4, 6)], (8, 8), False, cuda, None, []) is entry
        assert calls[0][0] == "copy+replay", "bound once: the next call copies its frame in"
        calls.clear()
        assert p.bind_ahead([frame], (8, 8), False, pool)
        lent.lend_again(0)  # its buffer lent again (another frame decoded into it): not the frame bound
        p._step_graph([frame], [(4, 6)], (8, 8), False, cuda, None, [])
        assert calls[-1][0] == "copy+replay"
        calls.clear()
        assert p.bind_ahead([frame], (8, 8), False, pool)
        p._step_graph([other], [(4, 6)], (8, 8), False, cuda, None, [])  # the bound frame was dropped
        assert calls[-1] == ("copy+replay", [lent.tensors[1].data_ptr()])
        assert not p.bind_ahead([np.full((4, 6, 3), 7, np.uint8)], (8, 8), False, pool), "not a lent buffer"
        assert not p.bind_ahead([frame], (8, 8), False, pool, keep_outputs=True), "no preprocessing graph yet"
        entry.bindable = False  # a preprocessing that gives its input back: nothing may write it early
        assert not p.bind_ahead([frame], (8, 8), False, pool)


def test_a_graph_launched_ahead_of_its_call_is_not_replayed_again_by_it():
    p, entry, calls = _binding_predictor()
    p._serving.stream = p.stream  # a thread serving the predictor: no stream context to enter
    cuda = types.SimpleNamespace(type="cuda")
    frame, other = np.full((4, 6, 3), 7, np.uint8), np.full((4, 6, 3), 9, np.uint8)
    pool = types.SimpleNamespace(copy_into=lambda f, dest, after: "done")
    with _Lent(frame, other) as lent:
        assert not p.launch_bound([frame]), "nothing bound: nothing launched"
        assert p.bind_ahead([frame], (8, 8), False, pool)
        calls.clear()
        assert p.launch_bound([frame]) and calls == [("replay",)]
        assert p._step_graph([frame], [(4, 6)], (8, 8), False, cuda, None, []) is entry
        assert calls == [("replay",)], "its call gives the step launched: no second replay"
        assert not p.launch_bound([frame]), "launched once"
        p._step_graph([frame], [(4, 6)], (8, 8), False, cuda, None, [])
        assert calls[-1][0] == "copy+replay", "the next call copies its frame in and replays"
        assert p.bind_ahead([frame], (8, 8), False, pool)
        calls.clear()
        assert not p.launch_bound([other]) and calls == [], "not the frame bound: nothing launched"
        p._step_graph([other], [(4, 6)], (8, 8), False, cuda, None, [])
        assert calls == [("copy+replay", [lent.tensors[1].data_ptr()])]
        assert p.bind_ahead([frame], (8, 8), False, pool)
        calls.clear()
        assert p.launch_bound([frame])
        p._step_graph([other], [(4, 6)], (8, 8), False, cuda, None, [])  # launched for a frame its call does not bring
        assert calls == [("replay",), ("copy+replay", [lent.tensors[1].data_ptr()])], "replayed again on its own frame"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a step's graph replays on a CUDA GPU")
def test_on_a_gpu_the_steps_graph_gives_the_stage_by_stage_results(tmp_path):
    import cv2
    from ultralytics.utils import ASSETS

    import enginekit
    from trained_detector import trained_detector

    predictor = enginekit.load(str(trained_detector().weights), conf=0.05, backend="torch")
    frame = cv2.imread(str(ASSETS / "bus.jpg"))
    staged = predictor(frame)  # the first call of a shape runs stage by stage
    assert not any(predictor._step_graphs.values())
    replayed = [predictor(frame) for _ in range(3)]
    assert any(predictor._step_graphs.values()), "the second call captured the step"
    assert len(staged.boxes) > 0, "the check compares detections"
    for r in replayed:
        assert np.array_equal(r.boxes, staged.boxes) and np.array_equal(r.scores, staged.scores)
        assert r.timings.infer > 0 and r.timings.preprocess >= 0 and r.timings.postprocess > 0


def test_with_two_steps_in_flight_the_frame_goes_into_the_preprocessing_graphs_input_once_it_has_replayed():
    from enginekit.runtime.predictor import PreGraph

    p, entry, calls = _binding_predictor()
    frame = np.full((4, 6, 3), 7, np.uint8)
    copies = []
    pool = types.SimpleNamespace(copy_into=lambda f, dest, after: copies.append((f, dest, after)) or "done")
    pre = PreGraph([torch.zeros(4, 6, 3, dtype=torch.uint8)], types.SimpleNamespace(
        replay=lambda: calls.append(("pre replay",))), "the network's input")
    p._pre_graphs[p._pre_key([frame], (8, 8), False)] = pre
    with _Lent(frame):
        assert not p.bind_ahead([frame], (8, 8), False, pool, keep_outputs=True), "never replayed: no event yet"
        pre.read_done = "preprocessed"
        assert p.bind_ahead([frame], (8, 8), False, pool, keep_outputs=True)
        assert copies == [(frame, pre.static_in[0], "preprocessed")] and calls == [("wait", "done")]
        calls.clear()
        x, fixed = p._device_batch([frame], (8, 8), False, types.SimpleNamespace(type="cuda"), None, [])
        assert (x, fixed) == ("the network's input", True) and calls == [("pre replay",)]
        assert pre.bound is None, "bound once"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph and a pinned pool")
def test_the_copy_into_a_graphs_input_waits_for_the_event_its_last_replay_recorded():
    """What ``bind_ahead`` rests on: a copy on another stream that waits on an event recorded inside a graph waits for
    that launch's node; without the wait the copy overtakes the graph's read (checked first: the check can fail)."""
    from enginekit.runtime.pinned import PinnedFrames

    pool = PinnedFrames(device=torch.device("cuda:0"))
    frame = pool.take((64, 64, 3))
    frame[:] = 1

    def read_after_copy(wait: bool) -> int:
        x = torch.zeros(64, 64, 3, dtype=torch.uint8, device="cuda")
        y = torch.empty_like(x)
        read = torch.cuda.Event(enable_timing=True, external=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(torch.cuda.Stream()):
            with torch.cuda.graph(graph):
                torch.cuda._sleep(50_000_000)  # the graph reads its input late
                y.copy_(x)
                read.record()
        graph.replay()
        done = pool.copy_into(frame, x, read if wait else None)
        torch.cuda.current_stream().wait_event(done)
        torch.cuda.synchronize()
        return int(y.sum())

    assert read_after_copy(False) > 0, "the copy overtakes the graph's read when it does not wait"
    assert read_after_copy(True) == 0
    pool.close()
