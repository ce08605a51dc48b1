"""What tune searches and how (pure: the measurer and the clock are passed in): settings and candidates, their costs and accuracy order, targets, the budget, pruning and the choice.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from enginekit import backends
from enginekit.errors import UsageError, first_line
from enginekit.precisions import PRECISIONS


#: expected cost of a precision relative to fp32, on a GPU backend and on a CPU one (ordering only)
GPU_PRECISION_COST = {"fp32": 1.0, "fp16": 0.55, "int8": 0.35, "fp8": 0.35}


CPU_PRECISION_COST = {"fp32": 1.0, "fp16": 1.4, "int8": 0.8, "fp8": 1.0}


#: accuracy rank of a precision: higher is more accurate
PRECISION_RANK = {"fp32": 3, "fp16": 2, "int8": 1, "fp8": 1}


#: a verify verdict that keeps a candidate in the running
ACCURACY_OK = ("pass", "not checkable", "not checked")


# -- what is searched --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One model's settings."""

    model: str  # as given (yolo12n, depth)
    backend: str
    precision: str
    input: tuple[int, int]  # H, W
    batch: int = 1  # frames per inference call
    on_gpu: bool = False

    @property
    def size(self) -> str:
        return f"{self.input[0]}x{self.input[1]}"

    def label(self) -> str:
        return f"{self.model} {self.backend} {self.precision} {self.size} batch {self.batch}"

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "backend": self.backend, "precision": self.precision, "input": self.size,
                "batch": self.batch}


def expected_cost(s: Setting, frames_per_step: int = 1) -> float:
    """A guess at a setting's time per step, for ordering only: area x precision x backend x calls."""
    table = GPU_PRECISION_COST if s.on_gpu else CPU_PRECISION_COST
    calls = math.ceil(frames_per_step / s.batch)
    return (s.input[0] * s.input[1] * frames_per_step * table.get(s.precision, 1.0) * backend_cost(s.backend, s.on_gpu)
            * (1.0 + 0.1 * (calls - 1)))


def backend_cost(name: str, on_gpu: bool) -> float:
    """A backend's expected cost relative to the best of its kind: ``auto``'s order among the backends that
    run where it runs (on a GPU: TensorRT 1, ONNX Runtime CUDA 1.5, PyTorch 2)."""
    kind = [b.name for b in backends.auto_order() if (b.runs_on != "cpu") == on_gpu]
    return 1.0 + 0.5 * kind.index(name) if name in kind else 2.0


def costs_no_more(a: Setting, b: Setting) -> bool:
    """``a`` costs no more than ``b`` by construction: the same model, backend and batch, an input no larger
    in either side, and the same precision (on a GPU: one no costlier)."""
    if (a.model, a.backend, a.batch) != (b.model, b.backend, b.batch):
        return False
    if a.input[0] > b.input[0] or a.input[1] > b.input[1]:
        return False
    if a.on_gpu:
        return GPU_PRECISION_COST.get(a.precision, 1.0) <= GPU_PRECISION_COST.get(b.precision, 1.0)
    return a.precision == b.precision


def accuracy_key(s: Setting) -> tuple:
    """Higher is more accurate: not quantized over quantized, then the larger input, then the higher precision."""
    quantized = PRECISIONS[s.precision].quantized if s.precision in PRECISIONS else False
    return (0 if quantized else 1, s.input[0] * s.input[1], PRECISION_RANK.get(s.precision, 0))


@dataclass(frozen=True)
class Targets:
    p50: Optional[float] = None
    p95: Optional[float] = None
    p99: Optional[float] = None
    fps: Optional[float] = None

    def misses(self, m: "Measured") -> list[str]:
        """What ``m`` misses, one phrase each ("p99 31.2 ms > 25")."""
        out = []
        for name in ("p50", "p95", "p99"):
            limit, value = getattr(self, name), getattr(m, f"{name}_ms")
            if limit is not None and (value is None or value > limit):
                out.append(f"{name} {_num(value)} ms > {limit:g}")
        if self.fps is not None and (m.fps is None or m.fps < self.fps):
            out.append(f"{_num(m.fps)} frames/s < {self.fps:g}")
        return out

    def describe(self) -> str:
        parts = [f"{name} <= {getattr(self, name):g} ms" for name in ("p50", "p95", "p99") if getattr(self, name)]
        if self.fps:
            parts.append(f">= {self.fps:g} frames/s")
        return ", ".join(parts)

    def shortfall(self, m: "Measured") -> float:
        """How far ``m`` is from meeting every target: the largest ratio of figure to limit (1: just meets)."""
        ratios = [getattr(m, f"{n}_ms") / getattr(self, n) for n in ("p50", "p95", "p99")
                  if getattr(self, n) and getattr(m, f"{n}_ms") is not None]
        if self.fps and m.fps:
            ratios.append(self.fps / m.fps)
        return max(ratios) if ratios else float("inf")


def _num(value) -> str:
    return "-" if value is None else f"{value:.1f}"


@dataclass
class Measured:
    """What measuring a candidate found."""

    p50_ms: Optional[float] = None
    p95_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    fps: Optional[float] = None
    peak_gpu_mib: Optional[float] = None
    accuracy: str = "not checked"  # pass | fail | not checkable | not checked
    accuracy_detail: str = ""
    seconds: float = 0.0
    stream: Optional[dict] = None  # the timing runs' StreamStats
    error: Optional[str] = None

    @property
    def timed(self) -> bool:
        return self.p50_ms is not None


@dataclass
class Candidate:
    settings: tuple[Setting, ...]
    frames_per_step: int = 1
    verdict: str = "pending"  # meets | misses | out | pruned | not measured | failed
    reason: str = ""
    measured: Optional[Measured] = None
    chosen: bool = False

    @property
    def kind(self) -> str:
        return "pipeline" if len(self.settings) > 1 else "model"

    def label(self) -> str:
        return " + ".join(s.label() for s in self.settings)

    def cost(self) -> float:
        return sum(expected_cost(s, self.frames_per_step) for s in self.settings)

    def accuracy(self) -> tuple:
        keys = [accuracy_key(s) for s in self.settings]
        return tuple(sum(k[i] for k in keys) for i in range(3))

    def costs_no_more(self, other: "Candidate") -> bool:
        return len(self.settings) == len(other.settings) and all(
            costs_no_more(a, b) for a, b in zip(self.settings, other.settings))

    def to_json(self) -> dict[str, Any]:
        m = self.measured or Measured()
        out: dict[str, Any] = {"kind": self.kind, "settings": [s.to_json() for s in self.settings],
                               "p50_ms": m.p50_ms, "p95_ms": m.p95_ms, "p99_ms": m.p99_ms, "fps": m.fps,
                               "peak_gpu_mib": m.peak_gpu_mib, "verdict": self.verdict, "reason": self.reason,
                               "accuracy": m.accuracy if self.measured else None,
                               "accuracy_detail": m.accuracy_detail or None, "chosen": self.chosen,
                               "seconds": round(m.seconds, 2) if self.measured else None}
        if m.stream is not None:
            out["stream"] = m.stream
        return out


# -- the search (pure: the measurer and the clock are passed in) -------------------------------------------
class Budget:
    """Minutes to spend; ``allows(estimate)``: a candidate of that many seconds may still start."""

    def __init__(self, minutes: Optional[float], clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.start = clock()
        self.seconds = None if minutes is None else minutes * 60.0
        self.longest = 0.0

    def spent(self) -> float:
        return self.clock() - self.start

    def allows(self) -> bool:
        return self.seconds is None or self.spent() + self.longest <= self.seconds

    def took(self, seconds: float) -> None:
        self.longest = max(self.longest, seconds)


def search(candidates: list[Candidate], measure: Callable[[Candidate], Measured], targets: Targets,
           budget: Budget, *, order: str = "cost", exact_only: bool = False,
           on_measured: Callable[[Candidate], None] = lambda c: None) -> list[Candidate]:
    """Measure ``candidates`` in ``order`` ("cost": cheapest first; "accuracy": most accurate first, then
    cheapest), leaving out what the ones measured already decide; each ends with its verdict. Returns them
    in the order they were considered.

    Left out: a candidate that a measured one costing no more already misses a speed target for; and one
    less accurate than a candidate that meets every target (it cannot be chosen). ``exact_only`` keeps the
    second rule off (a model searched alone for a pipeline: a less accurate setting may pair better)."""
    key = (lambda c: c.cost()) if order == "cost" else (lambda c: (tuple(-v for v in c.accuracy()), c.cost()))
    done: list[Candidate] = []
    for c in sorted(candidates, key=key):
        reason = _pruned_by(c, done, less_accurate=not exact_only)
        if reason:
            c.verdict, c.reason = "pruned", reason
        elif not budget.allows():
            c.verdict = "not measured"
            c.reason = f"over the budget ({budget.seconds / 60:g} min; {budget.spent() / 60:.1f} min spent)"
        else:
            started = budget.clock()
            try:
                m = measure(c)
            except UsageError:
                raise
            except Exception as exc:  # noqa: BLE001 - one candidate failing is a row, not the end
                m = Measured(error=first_line(exc, 200))
            m.seconds = m.seconds or budget.clock() - started
            budget.took(budget.clock() - started)
            c.measured = m
            _judge(c, targets)
            on_measured(c)
        done.append(c)
    return done


def _judge(c: Candidate, targets: Targets) -> None:
    m = c.measured
    if m.error:
        c.verdict, c.reason = "failed", m.error
    elif m.accuracy not in ACCURACY_OK:
        c.verdict, c.reason = "out", f"verify: {m.accuracy_detail or m.accuracy}"
    elif not m.timed:
        c.verdict, c.reason = "failed", "no step was timed"
    else:
        misses = targets.misses(m)
        c.verdict, c.reason = ("misses", "; ".join(misses)) if misses else ("meets", "")


def _pruned_by(c: Candidate, done: list[Candidate], *, less_accurate: bool = True) -> str:
    for d in done:
        if d.measured is None or d is c:
            continue
        if d.verdict == "misses" and d.measured.timed and d.costs_no_more(c):
            return f"{d.label()} costs no more and already misses ({d.reason})"
        if less_accurate and d.verdict == "meets" and d.accuracy() > c.accuracy():
            return f"{d.label()} meets every target and is more accurate"
    return ""


def choose(candidates: list[Candidate]) -> Optional[Candidate]:
    """The candidate that meets every target with the best accuracy, then the most frames per second."""
    meeting = [c for c in candidates if c.verdict == "meets"]
    if not meeting:
        return None
    best = max(meeting, key=lambda c: (c.accuracy(), c.measured.fps or 0.0))
    best.chosen = True
    return best


def nearest(candidates: list[Candidate], targets: Targets) -> Optional[Candidate]:
    """The timed candidate closest to meeting every target (for the one line when none meets)."""
    timed = [c for c in candidates if c.measured is not None and c.measured.timed
             and c.measured.accuracy in ACCURACY_OK]
    return min(timed, key=lambda c: targets.shortfall(c.measured)) if timed else None


def pipelines(per_model: list[list[Candidate]], frames_per_step: int) -> list[Candidate]:
    """Every combination of one candidate per model that met the targets alone (a frame of them all is at
    least as slow as its slowest model alone), as pipeline candidates."""
    kept = [[c for c in cands if c.verdict == "meets"] for cands in per_model]
    return [Candidate(tuple(c.settings[0] for c in combo), frames_per_step) for combo in itertools.product(*kept)]


def search_all(per_model: list[list[Candidate]], measure_one, measure_many, targets: Targets, budget: Budget,
               frames_per_step: int, on_measured=lambda c: None) -> tuple[list[Candidate], Optional[Candidate]]:
    """Each model's candidates alone; with several models, then the pipelines of those that met the targets
    alone. Returns every candidate considered and the choice (None: nothing meets)."""
    considered: list[Candidate] = []
    several = len(per_model) > 1
    for cands in per_model:
        considered += search(cands, measure_one, targets, budget, exact_only=several, on_measured=on_measured)
    if not several:
        return considered, choose(considered)
    combos = pipelines(per_model, frames_per_step)
    considered += search(combos, measure_many, targets, budget, order="accuracy", on_measured=on_measured)
    return considered, choose([c for c in considered if c.kind == "pipeline"])
