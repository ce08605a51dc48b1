"""bench measuring: warm-up, timed runs per (runner, batch), statistics, rows and the report."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from enginekit.bench.plan import BenchPlan, Planned, input_batch
from enginekit.backends.timing import Runner, Tick
from enginekit.bench.settings import BenchSettings
from enginekit.errors import first_line
from enginekit._version import __version__
from enginekit.backends.registry import distributions
from enginekit.hashing import sha256_file
from enginekit.latencies import record
from enginekit.pipeline import package_version

PERCENTILES = (50, 90, 95, 99)


def latency_stats(samples_ms: np.ndarray | list[float]) -> dict[str, float]:
    """p50/p90/p95/p99, mean, std, min and max of per-run latencies, in milliseconds."""
    samples = np.asarray(samples_ms, dtype=np.float64)
    stats = {f"p{q}": float(np.percentile(samples, q)) for q in PERCENTILES}
    stats.update(mean=float(samples.mean()), std=float(samples.std()), min=float(samples.min()),
                 max=float(samples.max()))
    return {k: round(v, 4) for k, v in stats.items()}


def throughput(batch: int, mean_ms: float) -> float:
    """Images per second of back-to-back runs, one batch at a time."""
    return round(batch * 1000.0 / mean_ms, 2) if mean_ms > 0 else 0.0


@dataclass
class BenchRow:
    """One runner at one batch size: numbers, or why there are none."""

    backend: str
    batch: int
    status: str  # ok | skipped | failed
    reason: str | None = None
    device: str | None = None  # "cpu" or the GPU's name; None when nothing ran
    precision: str = "fp32"
    host_device_copies: str | None = None  # excluded | included | not applicable
    cuda_graph: bool | None = None
    timer: str | None = None  # perf_counter | cuda-events
    detail: str = ""
    latency_ms: dict[str, float] | None = None
    throughput_ips: float | None = None
    iters: int = 0
    warmup: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def runs_per_row(settings: BenchSettings) -> int:
    return settings.warmup + settings.iters


def total_runs(plan: BenchPlan) -> int:
    """How many runs ``measure`` will make (for a progress bar)."""
    measured = sum(len(plan.settings.batches) - len(i.engine_skips) for i in plan.items
                   if i.skip is None and i.failure is None)
    return measured * runs_per_row(plan.settings)


@dataclass
class BenchReport:
    plan: BenchPlan
    rows: list[BenchRow]
    created: str

    @property
    def measured(self) -> list[BenchRow]:
        return [r for r in self.rows if r.status == "ok"]

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "enginekit_version": __version__,
            "created": self.created,
            "model": plan.adapter.variant,
            "weights": plan.weights_identity,
            "input": {
                "name": plan.adapter.input_name,
                "image_shape": list(plan.image_shape),
                "data": f"seeded random (seed {plan.settings.seed}); every backend gets the same array",
            },
            "settings": plan.settings.to_json(),
            "timing": {
                "latency": "milliseconds per run (one batch), synchronized after each run",
                "throughput_ips": "batch x 1000 / mean latency: images per second, one batch at a time",
                "host_device_copies": "excluded: inputs already on the GPU; included: every run copies the "
                                      "input from host memory and the outputs back; not applicable: CPU",
            },
            "machine": machine_info(plan.gpu),
            "results": [r.to_json() for r in self.rows],
        }


def measure(plan: BenchPlan, tick: Tick = lambda n: None) -> BenchReport:
    """Time every planned runner at every batch size; skipped runners become skipped rows."""
    rows = []
    for item in plan.items:
        for batch in plan.settings.batches:
            rows.append(_measure_one(plan, item, batch, tick))
    _keep_records(plan, rows)
    return BenchReport(plan, rows, datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _keep_records(plan: BenchPlan, rows: list[BenchRow]) -> None:
    """Each measured artifact's p50 into the cache's bench records (``enginekit.latencies``: verify --data's ladder
    quotes them). A record that cannot be written loses only the ladder's latency, never the measurement."""
    cache = getattr(plan.pipeline, "cache", None)
    if cache is None:
        return
    items = {item.name: item for item in plan.items}
    graphs: dict = {}
    for row in rows:
        item = items.get(row.backend)
        if row.status != "ok" or item is None or not row.latency_ms:
            continue
        try:
            manifest = item.manifests.get(row.batch)
            if manifest and manifest.get("key"):
                identity = f"engine:{manifest['key']}"
            elif item.onnx is not None:
                identity = graphs.get(item.onnx) or f"onnx:{sha256_file(item.onnx)}"
                graphs[item.onnx] = identity
            else:
                continue
            record(cache, row.device or "cpu", identity, row.backend, row.batch, row.latency_ms["p50"])
        except OSError:
            continue


def _measure_one(plan: BenchPlan, item: Planned, batch: int, tick: Tick) -> BenchRow:
    s = plan.settings
    precision = item.precision or s.precision
    reason = item.skip or item.engine_skips.get(batch)
    if reason is not None:
        return BenchRow(item.name, batch, "skipped", reason, precision=precision)
    if item.failure is not None:
        return BenchRow(item.name, batch, "failed", item.failure, precision=precision)
    runner = None
    done = 0

    def counted(n: int) -> None:
        nonlocal done
        done += n
        tick(n)

    try:
        runner = _make_runner(plan, item, batch)
        samples = runner.time(s.warmup, s.iters, counted)
    except Exception as exc:  # noqa: BLE001 - one backend failing (out of memory, say) is a row, not a crash
        tick(runs_per_row(s) - done)
        return BenchRow(item.name, batch, "failed", first_line(exc, 200), precision=precision)
    finally:
        if runner is not None:
            runner.close()
    stats = latency_stats(samples)
    return BenchRow(item.name, batch, "ok", None, device=runner.device, precision=precision,
                    host_device_copies=runner.copies, cuda_graph=runner.cuda_graph, timer=runner.timer,
                    detail=runner.detail, latency_ms=stats, throughput_ips=throughput(batch, stats["mean"]),
                    iters=s.iters, warmup=s.warmup)


def _make_runner(plan: BenchPlan, item: Planned, batch: int) -> Runner:
    """The backend's runner over what ``item`` runs at ``batch``, timed the backend's way."""
    backend = item.backend(item.artifact(plan, batch), **item.variant.options)
    return backend.timed(input_batch(plan, batch), include_copies=plan.settings.include_copies,
                         threads=plan.settings.threads)


def cpu_name() -> str:
    """The processor's model name (Linux /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(gpu) -> dict[str, Any]:
    import os

    return {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "gpu": gpu.to_json() if gpu is not None else None,
        "versions": {name: package_version(name) for name in distributions()},
    }
