"""A session reads a replayed graph's output where it is (``Backend.infer_fixed``), and the predictor's queued decode
reads the session's own output buffers where they are: no copy into buffers of their own per frame, and never a stale
input. CUDA graphs are stood in for here (no GPU needed): a "graph" re-runs what it captured on the tensors it was
captured on, as a replay reads the captured addresses."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")


class _Graph:
    """A stand-in CUDA graph: ``replay`` runs the captured function again and writes its outputs in place."""

    def __init__(self, fn, out):
        self.fn, self.out, self.replays = fn, out, 0

    def replay(self):
        self.replays += 1
        new = self.fn()
        for k in (self.out.keys() if isinstance(self.out, dict) else range(len(self.out))):
            self.out[k].copy_(new[k])


def _fake_capture(fn, device):
    out = fn()
    return _Graph(fn, out), out


def _torch_session(monkeypatch):
    from enginekit.backends import pytorch
    from enginekit.backends.base import Artifact

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    session = pytorch.Torch(Artifact.of_module(module, "images", ["y"], (1, 3, None, None)), device="cpu")
    session.activate()
    monkeypatch.setattr(pytorch, "capture_graph", _fake_capture)
    session.cuda_graph = True  # the GPU's path, its graphs stood in for
    return session


def test_a_torch_graph_reads_the_fixed_input_where_it_is_and_copies_any_other(monkeypatch):
    session = _torch_session(monkeypatch)
    x = torch.rand(1, 3, 24, 40)
    with torch.inference_mode():
        want = session._forward(x.clone())["y"].clone()
        first = session.infer_fixed(x)["y"].clone()
        graph, static_in, _ = session._graphs[x.shape]
        assert static_in is x  # captured on the caller's tensor: no buffer of its own, no copy
        torch.testing.assert_close(first, want)
        x.copy_(torch.rand(1, 3, 24, 40))  # the next frame, written in place (the preprocessing graph's replay)
        again = session.infer_fixed(x)["y"].clone()
        torch.testing.assert_close(again, session._forward(x.clone())["y"])
        assert (again - first).abs().max().item() > 1e-3  # not the first frame's outputs again
        y = torch.rand(1, 3, 24, 40)  # another tensor of that shape: copied into the graph's input, then replayed
        other = session.infer(y)["y"].clone()
        torch.testing.assert_close(other, session._forward(y.clone())["y"])
        assert torch.equal(x, y) and graph.replays == 3  # one per call (the first captures, then replays)
        plain = _torch_session(monkeypatch)  # ``infer`` keeps a buffer of its own: the caller's tensor untouched
        z = torch.rand(1, 3, 24, 40)
        plain.infer(z)
        assert plain._graphs[z.shape][1] is not z


def test_the_queued_decode_reads_the_sessions_buffers_and_copies_fresh_outputs(monkeypatch):
    """The decode graph is captured on the outputs it is first given: a session's buffers (the same tensors, rewritten
    by each call) are read where they are; outputs that are new tensors each call are copied into them. Either way
    every frame's detections are its own."""
    from enginekit.runtime import predictor as P

    monkeypatch.setattr(P, "capture_graph", _fake_capture)
    copies = []

    class Spec:
        key = ("sum",)

        def run(self, outputs):
            return [outputs["y"].sum(dim=-1)]

        def results(self, host, outputs):
            return host[0].copy()

    class Processor:
        def queued_decode(self, outputs, shapes, hw):
            return Spec()

    class Event:
        def record(self, stream):
            pass

    p = P.Predictor.__new__(P.Predictor)
    p.processor, p._post_graphs, p._post_seen, p._timing_events = Processor(), {}, {}, [Event() for _ in range(20)]
    p.info = type("Info", (), {"device": "cpu"})()
    p._device = torch.device("cpu")
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    buffers = {"y": torch.zeros(2, 5)}

    def decode(outputs):
        batch = P.GpuBatch([(8, 8)], (8, 8), outputs, [], None, False)
        real = torch.Tensor.copy_

        def counting(self, src, *a, **k):
            copies.append(self.shape)
            return real(self, src, *a, **k)

        monkeypatch.setattr(torch.Tensor, "copy_", counting)
        try:
            ready, build = p._queue_postprocess(batch, None)
        finally:
            monkeypatch.setattr(torch.Tensor, "copy_", real)
        return build()

    rng = np.random.default_rng(0)
    for step in range(4):  # the session's own buffers, rewritten in place at each call
        buffers["y"].copy_(torch.from_numpy(rng.random((2, 5), dtype=np.float32)))
        np.testing.assert_allclose(decode(buffers), buffers["y"].sum(-1).numpy(), rtol=1e-6)
    static_in = next(iter(p._post_graphs.values()))[0]
    assert static_in["y"] is buffers["y"]  # captured at the second call, on the buffers themselves
    assert copies.count((2, 5)) == 0, copies  # nothing copied into a buffer of the decode's own
    for step in range(3):  # fresh tensors at each call (a session without a graph): copied in, each its own result
        fresh = {"y": torch.from_numpy(rng.random((2, 5), dtype=np.float32))}
        copies.clear()
        np.testing.assert_allclose(decode(fresh), fresh["y"].sum(-1).numpy(), rtol=1e-6)
        assert copies.count((2, 5)) == 1
