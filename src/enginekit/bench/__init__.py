"""Latency and throughput of one model on several backends, fed the same inputs.

Two phases, so a caller can show steps (model load, ONNX export, engine builds) before a
progress bar over the timed runs:

    plan = prepare(settings)   # plan.py: which runners can run here; artifacts they need, from the cache
    report = measure(plan)     # measure.py: warm-up, then timed runs per (runner, batch)
    rows = measure_e2e([plan], [report], image)   # e2e.py: per frame through enginekit.load (optional)

``settings.py`` parses the flags, ``plot.py`` draws the report. The runners are the backends'
variants (``enginekit.backends``: each backend's ``timed`` prepares its run, ``backends.timing``
holds the clocks), so a registered backend is benched like the others. Each row says what its
time includes: host-to-device copies (excluded, included, or not applicable on CPU), CUDA graphs,
and the clock. A runner that cannot
run here is a row marked "skipped" with the reason, never a number. Nothing here prints.
"""

from __future__ import annotations

from enginekit.backends.timing import (COPIES_EXCLUDED, COPIES_INCLUDED, COPIES_NOT_APPLICABLE, Runner, time_cpu,
                                      time_cuda)
from enginekit.bench.e2e import E2ERow, default_image, e2e_json, measure_e2e
from enginekit.bench.measure import (
    PERCENTILES,
    BenchReport,
    BenchRow,
    latency_stats,
    machine_info,
    measure,
    runs_per_row,
    throughput,
    total_runs,
)
from enginekit.bench.plan import BenchPlan, Planned, input_batch, prepare
from enginekit.bench.plot import plot
from enginekit.bench.settings import (
    PRECISIONS,
    BenchSettings,
    parse_backends,
    parse_batches,
    parse_image_shape,
    runner_names,
)

__all__ = [
    "COPIES_EXCLUDED", "COPIES_INCLUDED", "COPIES_NOT_APPLICABLE", "PERCENTILES", "PRECISIONS",
    "BenchPlan", "BenchReport", "BenchRow", "BenchSettings", "E2ERow", "Planned", "Runner",
    "default_image", "e2e_json", "input_batch", "measure_e2e",
    "latency_stats", "machine_info", "measure", "parse_backends", "parse_batches", "parse_image_shape", "plot",
    "prepare", "runner_names", "runs_per_row", "throughput", "time_cpu", "time_cuda", "total_runs",
]
