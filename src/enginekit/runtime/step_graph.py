"""A whole step on a GPU as one CUDA graph: the preprocessing, the network and the queued decode with the copy of its
packed results to the host, replayed with one launch per step.

Where a predictor's preprocessing replays a graph and its session can run its network inside a graph of the caller's
(``Backend.forward_in_graph``: the torch backend), a step of one call with nothing queued behind it (one step in
flight, a direct call) replays this graph instead of three (preprocessing, network, decode) with timing events and
copies queued between them. Measured on an H200 machine (benchmarks/stream_gpu.md, tenth session) this moves
yolo12n's e2e/network ratio by about 0.01 only: the one replay and the frame's copy into its input cost the host
about what the three launches did (each torch call 20 to 46 us there), and the network starts when either is
queued; the device's own preprocessing time falls from 0.13 to 0.01 ms. The stage times come from timing events recorded inside the
graph (external events: event-record nodes), so each stage is still timed apart on the device. A step's graph is
captured on the second step of its shapes (the first runs stage by stage, which picks cuDNN's algorithms and shows
the outputs' shapes); where torch or the driver cannot capture it, the stages replay their own graphs as before.

A stream's next frame may be copied into the graph's input ahead of its step (``Predictor.bind_ahead``), once the
replay before has read it: the event after the preprocessing, recorded inside the graph, says when (each launch of
a graph records its event nodes anew, and a stream's wait is on the launch made last).

What the graph writes (its outputs, the packed rows' pinned host buffers, its events) is rewritten by its next
replay: a step is finished (``Predictor.finish_gpu``) before the next of its shapes is submitted, as a step that does
not keep its outputs already must be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

#: step graphs a predictor keeps (one per frame shapes and network size; the oldest dropped)
STEP_GRAPHS = 8


@dataclass
class StepGraph:
    """One step's captured graph. ``events``: start, preprocessed, inferred, and (with a queued decode) decoded and
    copied to ``hosts``; all recorded inside the graph."""

    static_in: list  # the frames as the graph reads them: each step's frames are copied in before the replay
    graph: Any
    outputs: dict  # the network's outputs, the graph's own tensors
    events: list
    spec: Any = None  # the processor's queued decode (None: postprocessed after the graph, as usual)
    hosts: list = field(default_factory=list)  # pinned buffers of the decode's packed tensors
    arrays: list = field(default_factory=list)  # NumPy views of ``hosts`` (made once)
    keeps: Any = None  # the session's function the graph ran (with what it reads: weights, anchors)
    bindable: bool = True  # nothing after the preprocessing reads ``static_in`` (``Predictor.bind_ahead`` may write it)
    bound: Any = None  # ``pinned.token`` of the frames copied into ``static_in`` ahead of their step, or None
    launched: Any = None  # ``bound`` once replayed ahead of its call's bookkeeping (``Predictor.launch_bound``)

    def replay(self, tensors: list) -> None:
        for s, t in zip(self.static_in, tensors):
            s.copy_(t, non_blocking=True)  # from the device, or a host frame from its own memory
        self.graph.replay()

    @property
    def read_done(self):
        """The event after the preprocessing, the last node that reads ``static_in``."""
        return self.events[1]

    @property
    def done(self):
        """The event after the graph's last node."""
        return self.events[-1]


def timing_events(count: int) -> list | None:
    """``count`` timing events that a capture records as event-record nodes; None where this torch has none."""
    import torch

    try:
        return [torch.cuda.Event(enable_timing=True, external=True) for _ in range(count)]
    except TypeError:  # a torch before external events
        return None


def capture_step(tensors: list, preprocess: Callable, forward_in_graph: Callable, plan: Callable | None,
                 capture: Callable, device) -> StepGraph | None:
    """Capture one step reading copies of ``tensors``: ``preprocess(static_in)`` -> the network's input x,
    ``forward_in_graph(x)`` -> a function giving the outputs by name (None: the session cannot), ``plan(outputs)`` ->
    the processor's queued decode or None. ``capture(fn, device)`` -> ``(graph, fn's answer)`` (``capture_graph``:
    one run before the capture). None where any part cannot be captured."""
    import torch

    events = timing_events(4)
    if events is None:
        return None
    static_in = [torch.empty(t.shape, dtype=t.dtype, device=device).copy_(t, non_blocking=True) for t in tensors]
    made: dict = {}

    def step():
        capturing = torch.cuda.is_current_stream_capturing()
        if capturing:
            events[0].record()
        x = preprocess(static_in)
        made["shares"] = any(shares_memory(x, s) for s in static_in)
        run = forward_in_graph(x)
        if run is None:
            raise RuntimeError("the session does not run inside a graph of the caller's")
        made["run"] = run
        if capturing:
            events[1].record()
        outputs = run()
        if capturing:
            events[2].record()
        if "spec" not in made:  # the run before the capture: what the decode is, its host buffers (no pinned
            made["spec"] = plan(outputs) if plan is not None else None  # allocation while capturing)
        spec = made["spec"]
        if spec is not None:
            packed = spec.run(outputs)
            if "hosts" not in made:
                made["hosts"] = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in packed]
            for h, p in zip(made["hosts"], packed):
                h.copy_(p, non_blocking=True)
            if capturing:
                events[3].record()
        return outputs

    try:
        graph, outputs = capture(step, device)
    except Exception:  # noqa: BLE001 - anything the capture refuses: the stages replay their own graphs
        return None
    spec = made.get("spec")
    hosts = made.get("hosts", []) if spec is not None else []
    return StepGraph(static_in, graph, outputs, events if spec is not None else events[:3], spec, hosts,
                     [h.numpy() for h in hosts], made["run"], bindable=not made["shares"])


def shares_memory(a, b) -> bool:
    """Whether tensors ``a`` and ``b`` are views of one memory (a preprocessing that gives its input back)."""
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (AttributeError, RuntimeError):
        return True
