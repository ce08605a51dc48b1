"""enginekit bench: latency percentiles and throughput per backend and batch size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import RandomInitOpt, SeedOpt, TrustOpt, WeightsOpt, handles_errors, quiet_third_party

DEFAULT_BACKENDS = "torch,onnxruntime"


def register(app: typer.Typer) -> None:
    @app.command("bench")
    @handles_errors
    def bench_cmd(
        model: Annotated[str, typer.Argument(help="Model name: yolo12n, depth, depth-anything-v2-base, ...")],
        batch: Annotated[Optional[str], typer.Option("--batch", "-b", help="Batch sizes, e.g. 1,8,16 (default: the N of --input, else 1).")] = None,
        input: Annotated[Optional[str], typer.Option("--input", "-i", help="Image size HxW, CxHxW or NxCxHxW (default: the family's, e.g. 640x640).")] = None,
        precision: Annotated[str, typer.Option("--precision", help="fp32 or fp16: the graph ONNX Runtime runs and engines are built from (torch rows name their own).")] = "fp32",
        backend: Annotated[str, typer.Option("--backend", help="Comma list of torch, onnxruntime, tensorrt, tensorrt-rtx, or single runners: torch-fp32, torch-fp16, torch-fp16-cudagraph, onnxruntime-cpu, onnxruntime-cuda.")] = DEFAULT_BACKENDS,
        warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs before timing.")] = 10,
        iters: Annotated[int, typer.Option("--iters", "-n", help="Timed runs per backend and batch size.")] = 50,
        include_copies: Annotated[bool, typer.Option("--include-copies", help="GPU rows: time the host-to-device input copy and the outputs' copy back (default: inputs already on the GPU).")] = False,
        threads: Annotated[Optional[int], typer.Option("--threads", help="CPU rows: intra-op threads of torch and ONNX Runtime (default: theirs).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report (settings, machine, every row) as JSON on stdout instead of the table.")] = False,
        plot_path: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of latency and throughput against batch size here.")] = None,
        weights: WeightsOpt = None,
        trust_checkpoint: TrustOpt = False,
        random_init: RandomInitOpt = False,
        seed: SeedOpt = 0,
    ) -> None:
        """Time a model on PyTorch, ONNX Runtime and TensorRT, fed the same seeded inputs.

        Warm-up, then timed runs: p50/p90/p95/p99 and mean latency per batch, and throughput.

        Every row says whether host-to-device copies are in its time and whether it replays a CUDA graph.

        A backend that cannot run here is a row marked skipped, with the reason; exit 3 only when nothing ran.

        Examples:

          enginekit bench yolo12n --random-init --batch 1,8

          enginekit bench yolo12n --precision fp16 --batch 1,8,16 --backend torch,onnxruntime,tensorrt --json > out.json

          enginekit bench depth --random-init --input 518x518 --backend torch --plot depth.png
        """
        from enginekit import bench

        _check_plot_path(plot_path)
        settings = _settings(model, batch, input, precision, backend, warmup, iters, include_copies, threads,
                             weights, random_init, seed)
        quiet_third_party()
        plan = bench.prepare(settings)
        report = _measure_with_progress(plan)
        if as_json:
            typer.echo(json.dumps(report.to_json(), indent=2))
        else:
            _render(report)
        _write_plot(report, plot_path)
        if not report.measured:
            from enginekit.errors import CapabilityError

            first = report.rows[0].reason if report.rows else "no backend"
            raise CapabilityError(f"no backend could run here (first reason: {first})")


def _settings(model, batch, input, precision, backend, warmup, iters, include_copies, threads, weights,
              random_init, seed):
    """Flags -> BenchSettings, validated before any model or library loads."""
    from enginekit.bench import BenchSettings, parse_backends, parse_batches, parse_image_shape

    image_shape, input_batch = parse_image_shape(input) if input else (None, None)
    batches = parse_batches(batch) if batch else [input_batch or 1]
    return BenchSettings(model, tuple(batches), image_shape, precision, tuple(parse_backends(backend)), warmup,
                         iters, include_copies, threads, weights, random_init, seed)


def _measure_with_progress(plan):
    from enginekit import bench, reporting

    with reporting.progress("timing", bench.total_runs(plan)) as progress:
        return bench.measure(plan, tick=progress.advance)


def _render(report) -> None:
    """Measured rows in a table; below it, what was skipped or failed and why, one line each."""
    from rich import box
    from rich.table import Table

    from enginekit.cli.render import out

    table = Table(title=_title(report), title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("backend", "batch", "device", "H2D copies", "CUDA graph", "p50", "p90", "p95", "p99", "mean",
                "img/s"):
        table.add_column(col, justify="left" if col in ("backend", "device", "H2D copies") else "right",
                         no_wrap=True)
    for row in report.measured:
        lat = row.latency_ms
        table.add_row(row.backend, str(row.batch), row.device if row.device == "cpu" else "cuda",
                      COPIES_SHORT.get(row.host_device_copies, row.host_device_copies),
                      "yes" if row.cuda_graph else "no", *(f"{lat[k]:.2f}" for k in LATENCY_COLUMNS),
                      f"{row.throughput_ips:.1f}")
    out.print(table)
    for backend, detail in dict.fromkeys((r.backend, r.detail) for r in report.measured if r.detail):
        out.print(f"  {backend}: {detail}")
    for row, batches in _collapsed([r for r in report.rows if r.status != "ok"]):
        tag = "[yellow]skipped[/]" if row.status == "skipped" else "[red]failed[/]"
        out.print(f"  {tag} {row.backend} (batch {batches}): {row.reason}")


LATENCY_COLUMNS = ("p50", "p90", "p95", "p99", "mean")
COPIES_SHORT = {"not applicable": "n/a"}


def _title(report) -> str:
    plan = report.plan
    s = plan.settings
    shape = "x".join(map(str, plan.image_shape))
    where = f"GPU {plan.gpu}" if plan.gpu else "no GPU"
    return (f"{plan.adapter.variant} {shape} ({s.precision} graphs/engines), {where}: latency in ms over "
            f"{s.iters} runs after {s.warmup} warm-up runs")


def _collapsed(rows):
    """One line per backend and reason, naming the batch sizes it covers."""
    shown: dict = {}
    for row in rows:
        shown.setdefault((row.backend, row.status, row.reason), (row, []))[1].append(row.batch)
    return [(row, ",".join(map(str, batches))) for row, batches in shown.values()]


_PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def _check_plot_path(plot_path: Optional[Path]) -> None:
    """Before any measuring: a plot path that can be written, with a picture format's suffix."""
    if plot_path is None:
        return
    from enginekit.errors import UsageError
    from enginekit.fsutil import check_output_path

    check_output_path(plot_path, "--plot")
    if plot_path.suffix.lower() not in _PLOT_SUFFIXES:
        raise UsageError(f"--plot {plot_path}: give a picture file name ending in {', '.join(_PLOT_SUFFIXES)}")


def _write_plot(report, plot_path: Optional[Path]) -> None:
    from enginekit.cli.render import console

    if plot_path is not None:
        if report.measured:
            from enginekit.bench import plot

            plot(report, plot_path)
            console.print(f"  wrote {plot_path}")
        else:
            console.print("  [yellow]no plot:[/] nothing was measured")
