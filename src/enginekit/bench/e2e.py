"""bench end to end: what a user feels per frame, through the runtime (``enginekit.load``).

Per frame: decode (reading the photograph's file), then the predictor's preprocess, infer and
postprocess (the per-stage timings ``enginekit predict`` reports, from ``Predictor.predict_frames``).
Each row runs on the artifacts the network-only rows of the same backend timed (the ONNX graph,
the batch-1 engine, the PyTorch model), so ``ratio_e2e_over_network`` compares like with like:
end-to-end p50 over the network-only p50 at batch 1. With several models, a pipeline row per
backend runs them all on each frame through the runtime's ``Pipeline``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enginekit.bench.measure import BenchReport, latency_stats
from enginekit.bench.plan import BenchPlan, Planned
from enginekit.backends.timing import Tick
from enginekit.errors import UsageError, first_line
from enginekit.backends.base import ENGINE, MODULE
from enginekit.images import embedded_image_paths
from enginekit.runtime.loader import load
from enginekit.runtime.predictor import Pipeline, read_image

STAGES = ("decode", "preprocess", "infer", "postprocess")


def default_image() -> Path:
    """The photograph end-to-end rows decode: the first one an installed package ships (images.py)."""
    paths = embedded_image_paths()
    if not paths:
        raise UsageError("no embedded photograph found for --e2e: install ultralytics or scikit-image, or pass --image")
    return paths[0]


def check_image(path: Path) -> tuple[int, int]:
    """(H, W) of a readable image; UsageError otherwise (before any model loads)."""
    return tuple(read_image(path).shape[:2])


@dataclass
class E2ERow:
    """One model (or a pipeline of models) on one backend, per frame, decode to results."""

    models: list[str]
    backend: str
    status: str  # ok | skipped | failed
    reason: str | None = None
    kind: str = "model"  # model | pipeline
    device: str | None = None
    runtime: str | None = None  # the runtime backend that ran it (load's backend names)
    precision: str | None = None
    input_hw: dict[str, list[int]] = field(default_factory=dict)  # per model: the network's H x W
    latency_ms: dict[str, float] | None = None
    stages_ms: dict[str, Any] | None = None  # mean per stage; a pipeline: decode + one dict per model
    throughput_fps: float | None = None
    network_p50_ms: float | None = None  # the network-only p50 at batch 1 (summed over a pipeline's models)
    ratio_e2e_over_network: float | None = None
    ratio_e2e_over_infer: float | None = None  # mean frame over mean infer stage, the same frames (robust to load drift)
    iters: int = 0
    warmup: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def runs_per_model(plan: BenchPlan) -> int:
    """How many e2e rows a plan makes (for a progress bar): one per backend that ran."""
    return sum(1 for i in plan.items if i.skip is None and i.failure is None)


def total_runs(plans: list[BenchPlan]) -> int:
    s = plans[0].settings
    rows = sum(runs_per_model(p) for p in plans)
    if len(plans) > 1:  # a pipeline row runs where every model's backend ran
        rows += sum(1 for items in zip(*(p.items for p in plans)) if all(i.skip is None and i.failure is None
                                                                          for i in items))
    return rows * (s.warmup + s.iters)


def _network_p50(report: BenchReport, backend: str) -> float | None:
    for row in report.rows:
        if row.backend == backend and row.batch == 1 and row.status == "ok":
            return row.latency_ms["p50"]
    return None


def _load(plan: BenchPlan, item: Planned):
    """A predictor over what ``item``'s network-only rows timed; a reason string when it cannot be made."""
    s = plan.settings
    backend, options = item.backend, item.variant.options
    common = dict(input_size=tuple(plan.image_shape[1:]), cache=plan.pipeline.cache)
    if MODULE in backend.runs:
        return load(s.model, item.variant.precision or "fp32", backend.name, weights=s.weights,
                    random_init=s.random_init, seed=s.seed, device=backend.default_device(None),
                    cuda_graph=bool(options.get("cuda_graph")), **common)
    if ENGINE in backend.runs:
        engine = item.engines.get(1)
        if engine is None:
            return f"no batch-1 engine: {item.engine_skips.get(1, 'add 1 to --batch')}"
        return load(engine, backend=backend.name, **common)
    return load(item.onnx, backend=backend.name, **common)


def _time_frames(run, image: Path, warmup: int, iters: int, tick: Tick):
    """Warm-up, then ``iters`` frames: decode + ``run(frame)`` timed with perf_counter; per-stage samples."""
    e2e, decode, results_per_frame = np.empty(iters), np.empty(iters), []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        frame = read_image(image)
        t1 = time.perf_counter()
        results = run(frame)
        t2 = time.perf_counter()
        tick(1)
        if i >= warmup:
            j = i - warmup
            decode[j], e2e[j] = (t1 - t0) * 1e3, (t2 - t0) * 1e3
            results_per_frame.append(results)
    return e2e, decode, results_per_frame


def _stage_means(results: list) -> dict[str, float]:
    return {k: round(float(np.mean([getattr(r.timings, k) for r in results])), 4)
            for k in ("preprocess", "infer", "postprocess")}


def _row(kind, models, item, predictors, run, plan, image, network_p50, tick) -> E2ERow:
    s = plan.settings
    e2e, decode, per_frame = _time_frames(run, image, s.warmup, s.iters, tick)
    stats = latency_stats(e2e)
    stages: dict[str, Any] = {"decode": round(float(decode.mean()), 4)}
    if kind == "model":
        stages.update(_stage_means([r[0] for r in per_frame]))
    else:
        for k, p in enumerate(predictors):
            stages[p.model] = _stage_means([r[k] for r in per_frame])
    ratio = round(stats["p50"] / network_p50, 3) if network_p50 else None
    infer = sum(v["infer"] for v in stages.values() if isinstance(v, dict)) if kind == "pipeline" else stages["infer"]
    first = predictors[0]
    return E2ERow(models, item.name, "ok", kind=kind, device=first.device, runtime=first.backend,
                  precision=first.precision, input_hw={p.model: list(_hw(p)) for p in predictors},
                  latency_ms=stats, stages_ms=stages, throughput_fps=round(1000.0 / stats["mean"], 2),
                  network_p50_ms=network_p50, ratio_e2e_over_network=ratio,
                  ratio_e2e_over_infer=round(stats["mean"] / infer, 3) if infer > 0 else None, iters=s.iters, warmup=s.warmup)


def _hw(predictor) -> tuple[int, ...]:
    processor = predictor.processor
    return tuple(getattr(processor, "hw", None) or getattr(processor, "fixed", None) or ())


class _Counted:
    """A tick that remembers how many runs it counted, so a row that fails can tick the rest."""

    def __init__(self, tick: Tick, total: int):
        self.tick, self.total, self.done = tick, total, 0

    def __call__(self, n: int) -> None:
        self.done += n
        self.tick(n)

    def rest(self) -> None:
        self.tick(self.total - self.done)


def _single(plan: BenchPlan, report: BenchReport, item: Planned, image: Path, outer: Tick) -> E2ERow:
    model = plan.adapter.variant
    skip = item.skip or item.failure
    if skip is not None:
        return E2ERow([model], item.name, "skipped" if item.skip else "failed", skip)
    s = plan.settings
    tick = _Counted(outer, s.warmup + s.iters)
    try:
        try:
            predictor = _load(plan, item)
        except UsageError as exc:  # the runtime cannot serve what this backend timed (a fixed input size, say)
            predictor = f"the runtime cannot load it: {exc}"
        if isinstance(predictor, str):
            tick.rest()
            return E2ERow([model], item.name, "skipped", predictor)
        return _row("model", [model], item, [predictor], lambda f: predictor.predict_frames([f]), plan, image,
                    _network_p50(report, item.name), tick)
    except Exception as exc:  # noqa: BLE001 - one backend failing is a row, not a crash
        tick.rest()
        return E2ERow([model], item.name, "failed", first_line(exc, 200))


def _pipeline(plans: list[BenchPlan], reports: list[BenchReport], index: int, image: Path, outer: Tick) -> E2ERow:
    items = [p.items[index] for p in plans]
    models = [p.adapter.variant for p in plans]
    name = items[0].name
    s = plans[0].settings
    for item in items:
        if item.skip or item.failure:
            return E2ERow(models, name, "skipped", item.skip or item.failure, kind="pipeline")
    tick = _Counted(outer, s.warmup + s.iters)
    pipeline = None
    try:
        try:
            predictors = [_load(p, i) for p, i in zip(plans, items)]
        except UsageError as exc:
            predictors = [f"the runtime cannot load it: {exc}"]
        missing = next((p for p in predictors if isinstance(p, str)), None)
        if missing is not None:
            tick.rest()
            return E2ERow(models, name, "skipped", missing, kind="pipeline")
        pipeline = Pipeline(predictors)
        nets = [_network_p50(r, name) for r in reports]
        network = round(sum(nets), 4) if all(nets) else None
        return _row("pipeline", models, items[0], predictors, pipeline, plans[0], image, network, tick)
    except Exception as exc:  # noqa: BLE001
        tick.rest()
        return E2ERow(models, name, "failed", first_line(exc, 200), kind="pipeline")
    finally:
        if pipeline is not None:
            pipeline.close()


def measure_e2e(plans: list[BenchPlan], reports: list[BenchReport], image: Path, tick: Tick = lambda n: None
                ) -> list[E2ERow]:
    """End-to-end rows: each model on each backend its network rows ran on; then, with several models,
    the pipeline of them all per backend (a backend any model skipped is skipped)."""
    rows = [_single(plan, report, item, image, tick) for plan, report in zip(plans, reports) for item in plan.items]
    if len(plans) > 1:
        rows += [_pipeline(plans, reports, i, image, tick) for i in range(len(plans[0].items))]
    return rows


def e2e_json(rows: list[E2ERow], image: Path, image_hw: tuple[int, int]) -> dict[str, Any]:
    return {
        "image": {"path": str(image), "name": image.name, "hw": list(image_hw)},
        "timing": {
            "latency": "milliseconds per frame with perf_counter: decode (reading the file) + preprocess + "
                       "infer + postprocess through enginekit.load's predictor (a pipeline: every model)",
            "stages_ms": "mean milliseconds per stage, as the predictor records them (enginekit predict's timings)",
            "throughput_fps": "frames per second, one frame at a time: 1000 / mean latency",
            "ratio_e2e_over_network": "end-to-end p50 / network-only p50 at batch 1 on the same backend "
                                      "(a pipeline: over the sum of its models' network p50); timed minutes "
                                      "apart, so a busy machine moves it",
            "ratio_e2e_over_infer": "mean frame time / mean infer stage of the same frames (a pipeline: the sum "
                                    "of its models' infer stages)",
        },
        "results": [r.to_json() for r in rows],
    }
