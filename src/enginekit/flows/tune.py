"""enginekit tune: the settings that meet a frame budget on this machine, found by search.

A candidate is one setting per model: a runtime backend, a precision, an input size and a batch (frames
per inference call). Each is built through the cache (``enginekit.load``), verified (the verify flow;
a candidate that fails its gates is out, with the reason) and timed end to end through the runtime's
streaming pipeline (decode, preprocess, infer, postprocess; ``enginekit.runtime.stream``).

The search, per model, then (several models) over the pipelines of the settings that each met the
targets alone (a frame of them all is at least as slow as its slowest model alone):

- a model's candidates go in order of expected cost (``expected_cost``: the input's area, the
  precision's cost on the backend, the backend's, the inference calls per step), cheapest first;
  pipelines go most accurate first, then cheapest;
- a candidate is left out (pruned) once a measured one that costs no more (the same backend and
  batch, an input no larger in either side and, on a GPU, a precision no costlier) already misses a
  speed target; and once a candidate that meets every target is more accurate than it (it cannot be
  chosen; not for a model searched alone ahead of its pipelines, where a less accurate setting may
  pair better);
- the budget: no candidate starts once the time spent, plus the longest candidate so far, passes it.

The choice: a candidate that meets every target and passed verify (or could not be checked), with the
best accuracy (``accuracy_key``: not quantized over quantized, then the larger input, then the higher
precision), then the most frames per second. Timing per candidate: one step in flight (nothing
queued before a step: its latency as a stream that keeps up sees it) gives p50/p95/p99 and frames/s;
where an --fps target is not met so, a second run with two steps in flight (stages overlapped) gives
the frames/s. ``search`` is the pure part (a measurer passed in); ``run_tune`` measures for real.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from enginekit import reporting
from enginekit.errors import CapabilityError, UsageError, first_line

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
    from enginekit import backends

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
    from enginekit.precisions import PRECISIONS

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


# -- the search space --------------------------------------------------------------------------------------
def default_backends(device: Optional[str]) -> list[str]:
    """The registered backends ``auto`` would try that run here: on a machine with a GPU those that run on it
    (TensorRT, ONNX Runtime CUDA, PyTorch), not the CPU's, which would only be timed to lose (``--backend``
    names them); on a CPU: ONNX Runtime."""
    from enginekit import backends
    from enginekit.gpu import gpu_info

    gpu = None if device == "cpu" else gpu_info()
    found = []
    for b in backends.auto_order():
        if b.runs_on != "cpu" and gpu is None:
            continue
        if b.runs_on == "any" and gpu is None:
            continue  # PyTorch on a CPU: the reference itself, slow, and not what is deployed
        if b.runs_on == "cpu" and gpu is not None:
            continue  # a GPU is here: the CPU's backends are tens of times slower (asked for by --backend)
        if b.check(device="cuda:0" if b.runs_on != "cpu" else "cpu", gpu=gpu).ok:
            found.append(b.name)
    return found


def space(request, index: int) -> list[Candidate]:
    """The ``index``-th model's candidates (every backend x precision x input x batch that can run)."""
    from enginekit import backends
    from enginekit.families import resolve
    from enginekit.precisions import names as precision_names

    from enginekit.gpu import check_device

    name = request.models[index]
    adapter = resolve(name, request.declared)
    check_device(request.device)
    chosen = request.backends or default_backends(request.device)
    if not chosen:
        raise UsageError("no backend runs here: `enginekit doctor` says why")
    for backend_name in request.backends:  # asked for by name: it must run here, said before any build
        backend = backends.get(backend_name)
        verdict = backend.check(device=backend.default_device(request.device))
        if not verdict.ok:
            raise CapabilityError(f"--backend {backend_name} does not run here: {verdict.reason}")
    sizes = request.sizes(index)
    batches = request.batches or [request.frames_per_step]
    out = []
    for backend_name in chosen:
        backend = backends.get(backend_name)
        device = backend.default_device(request.device)
        on_gpu = device.startswith("cuda")
        precisions = request.precisions or (list(precision_names(exported=True)) if on_gpu else ["fp32"])
        for precision in precisions:
            if backend.precisions is not None and precision not in backend.precisions:
                continue  # ONNX Runtime and PyTorch run fp32 and fp16 of a model name
            for hw, batch in itertools.product(sizes, batches):
                out.append(Candidate((Setting(name, backend_name, precision, hw, batch, on_gpu),),
                                     request.frames_per_step))
    if not out:
        raise UsageError(f"nothing to search for {name}: no backend of {', '.join(chosen)} runs "
                         f"{', '.join(request.precisions)} (onnxruntime and torch run fp32 and fp16; tensorrt all)")
    return out


# -- measuring for real ------------------------------------------------------------------------------------
class Measurer:
    """Builds (through the cache), verifies and streams candidates on this machine."""

    def __init__(self, request, source: Path, cache=None):
        self.request = request
        self.source = source
        self.cache = cache
        self.verified: dict[tuple, tuple[str, str]] = {}  # (model, backend kind, precision, input) -> verdict

    # loading ---------------------------------------------------------------------------------------------
    def _load(self, s: Setting):
        from enginekit.backends import ENGINE, get
        from enginekit.flows.load import load

        r = self.request
        index = r.models.index(s.model)
        model = r.model_request(index)
        options: dict[str, Any] = {}
        if ENGINE in get(s.backend).runs:
            shape = f"3x{s.input[0]}x{s.input[1]}"
            options["profiles"] = [f"1x{shape}" if s.batch == 1 else f"1x{shape}:{s.batch}x{shape}:{s.batch}x{shape}"]
        return load(s.model, s.precision, s.backend, weights=model.weights, random_init=model.random_init,
                    seed=model.seed, device=r.device, input_size=s.input, cache=self.cache, quiet=False,
                    **model.declared, **options)

    # verifying -------------------------------------------------------------------------------------------
    def _verify(self, s: Setting, predictor) -> tuple[str, str]:
        """(pass | fail | not checkable | not checked, why): the verify flow on what the candidate runs."""
        from enginekit.backends import ENGINE, MODULE, ONNX, get

        backend = get(s.backend)
        kind = MODULE if MODULE in backend.runs else ENGINE if ENGINE in backend.runs else ONNX
        key = (s.model, kind, s.precision, s.input, s.batch if kind == ENGINE else 0)
        if key not in self.verified:
            self.verified[key] = self._run_verify(s, kind, predictor)
        return self.verified[key]

    def _run_verify(self, s: Setting, kind: str, predictor) -> tuple[str, str]:
        from enginekit.backends import ENGINE, MODULE
        from enginekit.flows import run
        from enginekit.flows.verify import run_verify
        from enginekit.requests import VerifyRequest

        if kind == MODULE:
            return "not checked", ("PyTorch runs the model itself" + (" (the reference)" if s.precision == "fp32" else
                                   f" at {s.precision}; verify compares graphs and engines"))
        r = self.request
        model = r.model_request(r.models.index(s.model))
        weights = {"weights": model.weights, "random_init": model.random_init, "seed": model.seed,
                   "declared": model.declared}
        if kind == ENGINE:
            shape = f"3x{s.input[0]}x{s.input[1]}"
            profiles = [f"1x{shape}" if s.batch == 1 else f"1x{shape}:{s.batch}x{shape}:{s.batch}x{shape}"]
            request = VerifyRequest(target=s.model, precision=s.precision, task_required=not model.random_init,
                                    build_options={**weights, "profiles": profiles})
        else:
            request = VerifyRequest(target=str(predictor.source), precision=s.precision,
                                    task_required=not model.random_init, build_options=weights)
        with reporting.stage(f"verify {s.model} {s.precision} {s.size}") as st:
            outcome = run(run_verify, request, self.cache, quiet=True)
            verdict = _verdict(outcome, model.random_init)
            st.status = verdict[0]  # pass | fail | not checkable
            st.detail = verdict[1][:120]
        return verdict

    # timing ----------------------------------------------------------------------------------------------
    def _stream(self, predictors: list, settings: tuple[Setting, ...], every: dict) -> Measured:
        """One step in flight: p50/p95/p99 and frames/s; a second run with two in flight where an --fps target
        is not met so."""
        from enginekit.runtime.sources import open_source
        from enginekit.runtime.stream import Stream, StreamOptions

        r = self.request
        frames = (r.frames + 1) * r.frames_per_step
        batch = settings[0].batch if len(settings) == 1 else None
        runs = {}
        peak = None
        for in_flight in (1, 2):
            options = StreamOptions(frames_per_step=r.frames_per_step, batch=batch, in_flight=in_flight, every=every)
            with _GpuMemory(predictors) as memory:
                with reporting.stage(f"stream {len(predictors)} model(s), {in_flight} step(s) in flight") as st:
                    stream = Stream(predictors, [open_source(str(self.source), max_frames=frames)], options,
                                    names=[s.model for s in settings])
                    stats = stream.run()
                    st.detail = f"p50 {_num((stats.frame_ms or {}).get('p50'))} ms, " \
                                f"p99 {_num((stats.frame_ms or {}).get('p99'))} ms, {_num(stats.fps)} frames/s"
            peak = max(filter(None, (peak, memory.peak_mib))) if (peak or memory.peak_mib) else None
            runs[in_flight] = stats
            if r.fps is None or (stats.fps or 0) >= r.fps:
                break
        first = runs[1]
        frame = first.frame_ms or {}
        fps = max((s.fps or 0.0) for s in runs.values()) or None
        return Measured(frame.get("p50"), frame.get("p95"), frame.get("p99"), fps, peak,
                        stream={f"in_flight_{k}": v.to_json() for k, v in runs.items()})

    # the measurer's two entries ----------------------------------------------------------------------------
    def one(self, c: Candidate) -> Measured:
        s = c.settings[0]
        predictor = self._load(s)
        accuracy, detail = self._verify(s, predictor)
        if accuracy not in ACCURACY_OK:
            return Measured(accuracy=accuracy, accuracy_detail=detail)
        m = self._stream([predictor], c.settings, {})
        m.accuracy, m.accuracy_detail = accuracy, detail
        _release(predictor)
        return m

    def many(self, c: Candidate) -> Measured:
        predictors = [self._load(s) for s in c.settings]
        verdicts = [self._verify(s, p) for s, p in zip(c.settings, predictors)]
        m = self._stream(predictors, c.settings, _every(self.request, c.settings))
        worst = next((v for v in verdicts if v[0] == "not checkable"), None) or \
            next((v for v in verdicts if v[0] == "not checked"), None) or verdicts[0]
        m.accuracy = worst[0]
        m.accuracy_detail = "; ".join(f"{s.model}: {v[0]}" for s, v in zip(c.settings, verdicts))
        for p in predictors:
            _release(p)
        return m


def _every(request, settings) -> dict:
    return {k: v for k, v in request.every.items()}


def _verdict(outcome, random_init: bool) -> tuple[str, str]:
    """The verify outcome in tune's words: a pass whose task gates compared nothing is not checkable."""
    failures = [str(c) for r in outcome.reports for c in r.failures()]
    if not outcome.passed:
        return "fail", "; ".join(failures[:3]) or "verify failed"
    ran = [a for r in outcome.reports for a in r.artifacts if a.ran]
    # task metrics not compared, or an output part whose reference is the same for every input (its parity
    # could not fail: compare.comparison.VARIES)
    uncompared = [n for a in ran for n in a.notes if n.startswith(("task metrics not", "parity "))]
    if uncompared:
        why = "random weights: " if random_init else ""
        parity = " (parity passed)" if all(a.checked for a in ran) else ""
        return "not checkable", f"{why}{uncompared[0]}{parity}"
    checked = ", ".join(sorted({a.name for a in ran}))
    return "pass", f"parity and task gates passed ({checked})"


def _release(predictor) -> None:
    session = getattr(predictor, "session", None)
    if session is not None and hasattr(session, "deactivate"):
        session.deactivate()


class _GpuMemory:
    """The process's GPU memory at its highest while the block runs (NVML, sampled every 5 ms); None without
    a GPU in use."""

    def __init__(self, predictors):
        self.on_gpu = [p for p in predictors if p.info.on_gpu]
        self.peak_mib: Optional[float] = None

    def __enter__(self):
        import threading

        from enginekit.gpu import process_memory

        self.stop = threading.Event()
        if not self.on_gpu or process_memory() is None:
            self.thread = None
            return self

        def sample():
            peak = 0
            while not self.stop.wait(0.005):
                used = process_memory()
                if used is not None:
                    peak = max(peak, used)
            self.peak_mib = round(peak / 2**20, 1) if peak else None

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=2)


# -- the flow ----------------------------------------------------------------------------------------------
@dataclass
class TuneOutcome:
    targets: Targets
    candidates: list[Candidate]
    chosen: Optional[Candidate]
    source: str
    machine: dict
    recipes: list[Path] = field(default_factory=list)
    events: list = field(default_factory=list)

    @property
    def met(self) -> bool:
        return self.chosen is not None

    def best_line(self) -> str:
        """One line when nothing meets: the targets and the best figures reached."""
        best = nearest(self.candidates, self.targets)
        if best is None:
            why = "; ".join(sorted({f"{c.verdict}: {c.reason}" for c in self.candidates if c.reason}))[:300]
            return f"no candidate meets {self.targets.describe()}: none could be timed ({why or 'nothing to try'})"
        m = best.measured
        return (f"no candidate meets {self.targets.describe()}: the best reached p50 {_num(m.p50_ms)} ms, "
                f"p95 {_num(m.p95_ms)} ms, p99 {_num(m.p99_ms)} ms, {_num(m.fps)} frames/s ({best.label()})")

    def to_json(self) -> dict[str, Any]:
        return {"targets": {k: v for k, v in self.targets.__dict__.items() if v is not None},
                "source": self.source, "machine": self.machine,
                "candidates": [c.to_json() for c in self.candidates],
                "chosen": self.chosen.to_json() if self.chosen else None,
                "recipes": [str(p) for p in self.recipes]}


def run_tune(request, cache=None) -> TuneOutcome:
    import tempfile

    from enginekit.runtime.sources import open_source

    targets = Targets(request.p50, request.p95, request.p99, request.fps)
    per_model = [space(request, i) for i in range(len(request.models))]  # bad flags refused before any work
    _check_every(request)
    budget = Budget(request.budget_minutes)
    with tempfile.TemporaryDirectory(prefix="enginekit-tune-") as tmp:
        if request.source is not None:
            open_source(request.source, max_frames=1)  # a source that does not open: one line, now
            source, described = Path(request.source) if not request.source.isdigit() else request.source, request.source
        else:
            from enginekit.images import DEFAULT_VIDEO_HW
            from enginekit.images import write_video

            frames = (request.frames + 1) * request.frames_per_step
            with reporting.stage("video") as st:
                source = write_video(Path(tmp) / "tune.mp4", frames, DEFAULT_VIDEO_HW)
                st.detail = f"{DEFAULT_VIDEO_HW[1]}x{DEFAULT_VIDEO_HW[0]}, {frames} frames from the embedded photographs"
            described = f"a {DEFAULT_VIDEO_HW[1]}x{DEFAULT_VIDEO_HW[0]} MPEG-4 video made from the embedded photographs"
        measurer = Measurer(request, source, cache)
        count = sum(len(c) for c in per_model)
        reporting.note(f"{count} candidate(s) for {', '.join(request.models)}; targets {targets.describe()}"
                       + (f"; budget {request.budget_minutes:g} min" if request.budget_minutes else ""))

        def announce(c: Candidate) -> None:
            m = c.measured
            figures = f"p50 {_num(m.p50_ms)}, p95 {_num(m.p95_ms)}, p99 {_num(m.p99_ms)} ms, {_num(m.fps)} frames/s" \
                if m.timed else ""
            reporting.note(f"{c.label()}: {c.verdict}{': ' + c.reason if c.reason else ''}"
                           + (f" ({figures})" if figures and c.verdict == "meets" else ""))

        considered, chosen = search_all(per_model, measurer.one, measurer.many, targets, budget,
                                        request.frames_per_step, on_measured=announce)
    outcome = TuneOutcome(targets, considered, chosen, described, _machine())
    if chosen is not None and request.write_recipe is not None:
        outcome.recipes = write_recipes(request, chosen, targets, outcome.machine)
    return outcome


def _check_every(request) -> None:
    from enginekit.families import resolve

    known = {}
    for name in request.models:
        adapter = resolve(name, request.declared)
        for alias in (name, adapter.variant, adapter.family):
            known.setdefault(alias, name)
    for key, n in request.every.items():
        if key not in known:
            raise UsageError(f"--every {key}={n}: no such model here (models: {', '.join(request.models)})")


def _machine() -> dict:
    import platform

    from enginekit.gpu import gpu_info

    gpu = gpu_info()
    import os

    return {"gpu": str(gpu) if gpu else None, "cpu": (platform.machine() or "").replace("_", "-"),
            "cpu_count": os.cpu_count()}


# -- recipes -----------------------------------------------------------------------------------------------
def recipe_of(request, setting: Setting, measured: Measured, targets: Targets, machine: dict) -> dict:
    """The recipe that builds what ``setting`` runs, with how to run it (``runtime:``) and what was measured."""
    from enginekit.families import resolve

    index = request.models.index(setting.model)
    model = request.model_request(index)
    adapter = resolve(setting.model, request.declared)
    shape = f"3x{setting.input[0]}x{setting.input[1]}"
    profile = f"1x{shape}" if setting.batch == 1 else f"1x{shape}:{setting.batch}x{shape}:{setting.batch}x{shape}"
    where = machine.get("gpu") or f"a {machine.get('cpu_count')}-core {machine.get('cpu') or ''} CPU machine".replace("  ", " ")
    section: dict[str, Any] = {"variant": adapter.variant}
    if model.weights is not None:
        section["weights"] = str(Path(model.weights).resolve())
    else:
        section["random_init"] = bool(model.random_init)
    if model.seed:
        section["seed"] = model.seed
    section.update(model.declared)  # --task, --classes...: the recipe's model: section declares the same
    recipe: dict[str, Any] = {
        "description": (f"enginekit tune: {setting.label()}, for {targets.describe()}; measured on {where}: p50 "
                        f"{_num(measured.p50_ms)} ms, p95 {_num(measured.p95_ms)} ms, p99 {_num(measured.p99_ms)} ms, "
                        f"{_num(measured.fps)} frames/s"),
        "model": section,
        "profiles": [profile],
        "precisions": [setting.precision],
        "trt": "auto",  # the TensorRT that builds: TensorRT where it runs, else TensorRT-RTX
        "runtime": {"backend": setting.backend, "input": setting.size, "batch": setting.batch,
                    "frames_per_step": request.frames_per_step,
                    "every": _cadence_of(request, setting.model)},
    }
    if model.random_init:
        recipe["verification"] = {"task_required": False}  # random weights: nothing for the task gates to compare
    return recipe


def _cadence_of(request, model: str) -> int:
    from enginekit.families import resolve

    adapter = resolve(model, request.declared)
    for key, n in request.every.items():
        if key in (model, adapter.variant, adapter.family):
            return n
    return 1


def write_recipes(request, chosen: Candidate, targets: Targets, machine: dict) -> list[Path]:
    """One recipe per model (``--write-recipe FILE.yaml`` for one model; a folder: ``<model>.yaml`` each),
    checked by the recipe loader before it is kept."""
    import yaml

    from enginekit.families import resolve
    from enginekit.recipes import load_recipe

    target = Path(request.write_recipe)
    single = target.suffix.lower() in (".yaml", ".yml")
    written = []
    for s in chosen.settings:
        path = target if single else target / f"{resolve(s.model, request.declared).variant}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = recipe_of(request, s, chosen.measured, targets, machine)
        tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
        tmp.write_text("# written by enginekit tune; `enginekit build` and `make nightly` take it as it is\n"
                       + yaml.safe_dump(data, sort_keys=False, width=120))
        try:
            load_recipe(str(tmp))
        except Exception:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(path)
        written.append(path)
    return written
