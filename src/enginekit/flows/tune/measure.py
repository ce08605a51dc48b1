"""Measuring candidates for real: each built (through the cache), verified and streamed end to end on this machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from enginekit import reporting
from enginekit.backends import ENGINE, MODULE, ONNX, get
from enginekit.flows import run
from enginekit.flows.load import load
from enginekit.flows.tune.search import ACCURACY_OK, Candidate, Measured, Setting, _num
from enginekit.flows.verify import run_verify
from enginekit.gpu import process_memory
from enginekit.requests import VerifyRequest
from enginekit.runtime.sources import open_source
from enginekit.runtime.stream import Stream, StreamOptions


# -- measuring for real ------------------------------------------------------------------------------------
class Measurer:
    """Builds (through the cache), verifies and streams candidates on this machine."""

    def __init__(self, request, source: Path, cache=None, images: Path | None = None):
        """``images``: frames of the user's source that verify checks on (None: the embedded photographs)."""
        self.request = request
        self.source = source
        self.cache = cache
        self.images = images
        self.verified: dict[tuple, tuple[str, str]] = {}  # (model, backend kind, precision, input) -> verdict

    # loading ---------------------------------------------------------------------------------------------
    def _load(self, s: Setting):
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
        backend = get(s.backend)
        kind = MODULE if MODULE in backend.runs else ENGINE if ENGINE in backend.runs else ONNX
        key = (s.model, kind, s.precision, s.input, s.batch if kind == ENGINE else 0)
        if key not in self.verified:
            self.verified[key] = self._run_verify(s, kind, predictor)
        return self.verified[key]

    def _run_verify(self, s: Setting, kind: str, predictor) -> tuple[str, str]:
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
                                    images=self.images, build_options={**weights, "profiles": profiles})
        else:
            request = VerifyRequest(target=str(predictor.source), precision=s.precision, images=self.images,
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
