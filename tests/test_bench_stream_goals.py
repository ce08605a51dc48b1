"""benchmarks/stream_gpu.py judges the pair by the two networks side by side: what it reads and how it judges.

The figures come from a GPU; here the reading (the span from the first network's start to the last one's end, out
of each model's two events, whatever order the models ran in) and the goal's arithmetic are checked on stand-ins,
so a wrong sign, a wrong model or a goal that cannot fail shows on any machine.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "stream_gpu.py"


@pytest.fixture(scope="module")
def sg():
    spec = importlib.util.spec_from_file_location("stream_gpu_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Event:
    """A CUDA event's stand-in: a time on the GPU (ms)."""

    def __init__(self, t: float):
        self.t = t

    def elapsed_time(self, other: "Event") -> float:
        return other.t - self.t


class Predictor:
    def __init__(self, model: str):
        self.model = model

    def finish_gpu(self, batch):
        return [f"{self.model} results"]


class FakeStream:
    def __init__(self, models):
        self._lock = threading.Lock()
        self._due: dict[int, set] = {}
        self.answered: list = []
        self.models = models

    def _answer(self, step, model, results, times):
        with self._lock:
            self._due[step.index].discard(model)
        self.answered.append((step.index, model))


def batch(start: float, network_start: float, network_end: float):
    return SimpleNamespace(events=[Event(start), Event(network_start), Event(network_end)])


def test_the_span_is_first_network_start_to_last_network_end_whatever_the_order(sg):
    yolo, depth = Predictor("yolo"), Predictor("depth")
    s = FakeStream(["yolo", "depth"])
    spans = sg.Spans(s, [yolo, depth])
    # step 0: yolo's network 1.0-2.6, depth's 1.1-2.8: 1.8. step 1: depth starts first (0.5), yolo ends last (2.9)
    for index, (y, d, order) in enumerate((((0.9, 1.0, 2.6), (1.0, 1.1, 2.8), "yd"),
                                           ((0.8, 0.9, 2.9), (0.4, 0.5, 2.0), "dy"))):
        s._due[index] = {"yolo", "depth"}
        step = SimpleNamespace(index=index)
        for who in order:
            p, b = (yolo, y) if who == "y" else (depth, d)
            assert p.finish_gpu(batch(*b)) == [f"{p.model} results"]  # the wrapper gives the real results
            s._answer(step, p.model, [], None)
    assert spans.spans == pytest.approx([1.8, 2.4])
    assert spans.missed == 0
    assert s.answered == [(0, "yolo"), (0, "depth"), (1, "depth"), (1, "yolo")]  # every answer still reaches the stream
    spans.close()
    assert "finish_gpu" not in vars(yolo) and yolo.finish_gpu(None) == ["yolo results"]


def test_a_step_without_both_networks_events_is_counted_missed_not_read(sg):
    yolo, depth = Predictor("yolo"), Predictor("depth")
    s = FakeStream(["yolo", "depth"])
    spans = sg.Spans(s, [yolo, depth])
    s._due[0] = {"yolo", "depth"}
    step = SimpleNamespace(index=0)
    yolo.finish_gpu(batch(0.0, 0.1, 1.0))
    s._answer(step, "yolo", [], None)
    s._answer(step, "depth", [], None)  # depth answered without a finish_gpu (a failure's answer)
    assert spans.spans == [] and spans.missed == 1


def runs(pair50: float, span50: float | None, yolo=(1.40, 1.65), depth=(1.45, 1.70), in_pair=(1.60, 1.75)):
    """Figures as the stream reports them: per model alone (network p50, e2e p50), the pair's own."""
    def alone(model, network, e2e):
        return {"frame_ms": {"p50": e2e}, "models": {model: {"infer_ms": {"p50": network}, "latency_ms": {"p50": e2e}}}}

    pair = {"frame_ms": {"p50": pair50, "p99": pair50 * 1.1}, "fps": 1000.0 / pair50,
            "models": {"yolo12n": {"infer_ms": {"p50": in_pair[0]}}, "depth": {"infer_ms": {"p50": in_pair[1]}}}}
    if span50 is not None:
        pair["networks_span_ms"] = {"p50": span50, "p99": span50 * 1.05}
        pair["networks_span_steps"] = {"read": 100, "missed": 0}
    return {"yolo alone": alone("yolo12n", *yolo), "depth alone": alone("depth", *depth), "pair": pair,
            "pair stream": {"fps": 1000.0 / pair50}}


def test_the_pair_goal_is_the_span_plus_the_slower_models_way(sg):
    # depth is the slower alone (e2e 1.70 > 1.65): its way 0.25; bound 1.1 x 1.80 + 0.25 = 2.23
    goal = sg.pair_goal(runs(2.20, 1.80))
    assert "depth's way" in goal["goal"]
    assert goal["value"] == pytest.approx(2.20 / 2.23, abs=1e-3) and goal["met"]
    assert not sg.pair_goal(runs(2.26, 1.80))["met"]  # the goal can fail
    # the slower model by e2e alone, not by network: yolo slower now, its way 0.5
    goal = sg.pair_goal(runs(2.40, 1.80, yolo=(1.30, 1.80)))
    assert "yolo12n's way" in goal["goal"] and goal["value"] == pytest.approx(2.40 / 2.48, abs=1e-3)


def test_without_a_span_the_per_model_bound_judges_and_the_reading_before_is_shown_not_judged(sg):
    # per model: depth 1.75 + 0.25 = 2.00 (yolo 1.60 + 0.25 = 1.85): 1.1 x 2.00 = 2.20
    goal = sg.pair_goal(runs(2.15, None))
    assert "depth network p50 in the pair" in goal["goal"] and goal["limit"] == "<= 1.1"
    assert goal["value"] == pytest.approx(2.15 / 2.00, abs=1e-3) and goal["met"]
    assert not sg.pair_goal(runs(2.25, None))["met"]
    assert sg.readings(runs(2.15, None)) == []
    reading, = sg.readings(runs(2.15, 1.80))
    assert reading["value"] == pytest.approx(2.15 / 2.00, abs=1e-3) and "met" not in reading
    names = [g["goal"] for g in sg.goals(runs(2.20, 1.80))]
    assert sum(n.startswith("pair p50 /") for n in names) == 1  # one pair goal judged, the old reading only shown
