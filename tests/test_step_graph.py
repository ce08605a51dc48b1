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


def test_the_dispatching_thread_uploads_the_frames_that_wait_once_each():
    from enginekit.runtime.stream import Stream
    from enginekit.runtime.stream_queues import DropQueue
    from enginekit.runtime.stream_records import Frame

    uploads = []
    q = DropQueue(4, "none")
    stop = types.SimpleNamespace(is_set=lambda: False)
    frames = [np.zeros((4, 6, 3), np.uint8), np.zeros((2, 2), np.uint8), np.zeros((4, 6, 3), np.uint8)]
    for i, image in enumerate(frames):
        q.put(Frame(0, i, str(i), image, 0.0, 0.0), stop)
    host = types.SimpleNamespace(
        _pinned=types.SimpleNamespace(device="cuda:0", upload=lambda image: uploads.append(id(image))),
        queues=[q], _whole_frame_on_device=lambda image: image.ndim == 3)
    Stream._upload_ahead(host)
    assert uploads == [id(frames[0]), id(frames[2])], "the waiting frames a GPU model takes whole, in order"
    assert [f.index for f in q.waiting()] == [0, 1, 2], "left waiting"
    host._pinned.device = None  # several GPUs: no device to copy to ahead
    Stream._upload_ahead(host)
    assert len(uploads) == 2


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
