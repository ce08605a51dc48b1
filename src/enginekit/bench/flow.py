"""``enginekit bench`` as one call: a BenchRequest -> a BenchOutcome (``enginekit.api.bench``; the CLI renders it).

Everything the request names is checked before any model loads (the photograph --e2e decodes, --every's models);
then each model is planned (``prepare``: its graphs and engines through the cache) and timed, with --e2e per frame
and with --stream through the streaming pipeline, under one progress bar each; the plot is drawn last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from enginekit import reporting
from enginekit.bench.e2e import E2ERow, check_image, default_image, e2e_json, measure_e2e
from enginekit.bench.e2e import total_runs as e2e_runs
from enginekit.bench.measure import BenchReport, measure, total_runs
from enginekit.bench.plan import prepare
from enginekit.bench.plot import plot
from enginekit.bench.settings import BenchSettings, parse_image_shape
from enginekit.bench.stream import measure_stream, stream_json
from enginekit.bench.stream import total_runs as stream_runs
from enginekit.errors import UsageError
from enginekit.families import resolve
from enginekit.requests import BenchRequest
from enginekit.runtime.sources import open_source
from enginekit.runtime.stream import StreamOptions, parse_every


@dataclass
class BenchOutcome:
    """What ``bench`` measured: ``reports`` (per model: network-only rows per runner and batch), ``e2e`` (per-frame
    rows, with ``e2e``), ``stream`` (stream rows and the source described, with ``stream``), ``plot`` (the picture
    written, if any), and the run's ``events``."""

    settings: list[BenchSettings]
    reports: list[BenchReport]
    e2e: Optional[list[E2ERow]] = None
    image: Optional[Path] = None
    image_hw: Optional[tuple[int, int]] = None
    stream: Optional[tuple[list, str]] = None
    plot: Optional[Path] = None
    events: list = field(default_factory=list)

    @property
    def measured(self) -> bool:
        """Whether any runner ran (a machine with none of them has only skipped rows)."""
        return any(r.measured for r in self.reports)

    def to_json(self) -> dict[str, Any]:
        """One model: its report (plus "end_to_end", "stream"); several: {"models": [reports], ...}."""
        reports = self.reports
        data = reports[0].to_json() if len(reports) == 1 else {
            "enginekit_version": reports[0].to_json()["enginekit_version"], "models": [r.to_json() for r in reports]}
        if self.e2e is not None:
            data["end_to_end"] = e2e_json(self.e2e, self.image, self.image_hw)
        if self.stream is not None:
            data["stream"] = stream_json(*self.stream)
        return data


def run_bench(request: BenchRequest, cache=None) -> BenchOutcome:
    """Time ``request.models`` as the request says (see the module's docstring)."""
    image, image_hw = (None, None)
    if request.e2e:
        image = request.image if request.image is not None else default_image()
        image_hw = check_image(image)
    stream_options = _stream_options(request) if request.stream else None
    settings = [_settings(request, model) for model in request.models]
    if request.stream and request.source is not None:
        open_source(request.source, max_frames=1)  # a source that does not open: one line, before any model loads
    plans = [prepare(s, cache=cache) for s in settings]
    total = sum(total_runs(p) for p in plans) + (e2e_runs(plans) if image is not None else 0)
    with reporting.progress("timing", total) as progress:
        reports = [measure(p, tick=progress.advance) for p in plans]
        rows = measure_e2e(plans, reports, image, tick=progress.advance) if image is not None else None
    outcome = BenchOutcome(settings, reports, rows, image, image_hw)
    if stream_options is not None:
        with reporting.progress("streaming", stream_runs(plans)) as progress:
            outcome.stream = measure_stream(plans, reports, request.source, stream_options, tick=progress.advance)
    if request.plot is not None:
        if reports[0].measured:
            plot(reports[0], request.plot)
            outcome.plot = request.plot
        else:
            reporting.note("no plot: nothing was measured")
    return outcome


def _settings(request: BenchRequest, model: str) -> BenchSettings:
    """One model's BenchSettings (checked before any model or library loads)."""
    image_shape, input_batch = parse_image_shape(request.input) if request.input else (None, None)
    return BenchSettings(model, tuple(request.batches or [input_batch or 1]), image_shape, request.precision,
                         tuple(request.backends),
                         request.warmup, request.iters, request.include_copies, request.threads, request.weights,
                         request.random_init, request.seed)


def _stream_options(request: BenchRequest) -> StreamOptions:
    """--stream's options; --every names a model of the request (as given, its variant or its family)."""
    aliases = {}  # what --every may call a model -> its variant, the name its rows carry
    for m in request.models:
        adapter = resolve(m)
        for alias in (m, adapter.variant, adapter.family):
            aliases.setdefault(alias, adapter.variant)
    cadence = {}
    for key, n in parse_every(request.every).items():
        if key not in aliases:
            raise UsageError(f"--every {key}={n}: no such model here (models: {', '.join(request.models)})")
        cadence[aliases[key]] = n
    return StreamOptions(drop=request.drop, every=cadence, frames_per_step=request.frames_per_step,
                         in_flight=request.in_flight)
