"""enginekit bench: latency percentiles and throughput per backend and batch size."""

from __future__ import annotations

from enginekit.fsutil import json_text
from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.backends import registry
from enginekit.cli.common import (EveryOpt, FramesPerStepOpt, DropOpt, InFlightOpt, ImgszOpt, RandomInitOpt, RemoteOpt, RemoteReadOnlyOpt, SeedOpt, TrustOpt, WeightsOpt, handles_errors,
                                  quiet_third_party)


def _backend_help() -> str:
    """--backend's help, from the registry: the words that stand for several runners, then every runner."""
    words = ", ".join(registry.shorthands())
    return f"Comma list of runners ({', '.join(registry.variants())}), or of {words} (each: all its runners)."


def register(app: typer.Typer) -> None:
    @app.command("bench")
    @handles_errors
    def bench_cmd(
        model: Annotated[str, typer.Argument(help="Model name: yolo12n, depth, depth-anything-v2-base, ...; a comma list times each (and, with --e2e, their pipeline).")],
        batch: Annotated[Optional[str], typer.Option("--batch", "-b", help="Batch sizes, e.g. 1,8,16 (default: the N of --input, else 1).")] = None,
        input: Annotated[Optional[str], typer.Option("--input", "-i", help="Image size HxW, CxHxW or NxCxHxW (default: the family's, e.g. 640x640).")] = None,
        imgsz: ImgszOpt = None,
        precision: Annotated[str, typer.Option("--precision", help="fp32 or fp16: the graph ONNX Runtime runs and engines are built from (torch rows name their own).")] = "fp32",
        backend: Annotated[str, typer.Option("--backend", help=_backend_help())] = registry.BENCH_DEFAULT,
        warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs before timing.")] = 10,
        iters: Annotated[int, typer.Option("--iters", "-n", help="Timed runs per backend and batch size.")] = 50,
        include_copies: Annotated[bool, typer.Option("--include-copies", help="GPU rows: time the host-to-device input copy and the outputs' copy back (default: inputs already on the GPU).")] = False,
        threads: Annotated[Optional[int], typer.Option("--threads", help="CPU rows: intra-op threads of torch and ONNX Runtime (default: theirs).")] = None,
        e2e: Annotated[bool, typer.Option("--e2e", help="Also time what a user feels per frame: decode a photograph, preprocess, infer, postprocess through enginekit.load, beside the network-only rows (and, for several models, their pipeline).")] = False,
        image: Annotated[Optional[Path], typer.Option("--image", help="--e2e: the photograph to decode every frame (default: one an installed package ships, e.g. Ultralytics' bus.jpg).")] = None,
        stream: Annotated[bool, typer.Option("--stream", help="Also stream a video through the runtime's streaming pipeline (decode in its own thread, stages overlapped): each model alone and, for several models, all of them per frame; every stage's and the whole step's p50/p95/p99 and frames/s.")] = False,
        source: Annotated[Optional[str], typer.Option("--source", help="--stream: a video, a folder of images or a camera index (default: a 1280x720 video made from the embedded photographs, --iters + 1 steps long).")] = None,
        every: EveryOpt = None,
        frames_per_step: FramesPerStepOpt = 1,
        drop: DropOpt = "none",
        in_flight: InFlightOpt = 2,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report (settings, machine, every row) as JSON on stdout instead of the table.")] = False,
        plot_path: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of latency and throughput against batch size here.")] = None,
        weights: WeightsOpt = None,
        trust_checkpoint: TrustOpt = False,
        random_init: RandomInitOpt = False,
        seed: SeedOpt = 0,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
    ) -> None:
        """Time a model on PyTorch, ONNX Runtime and TensorRT, fed the same seeded inputs.

        Warm-up, then timed runs: p50/p90/p95/p99 and mean latency per batch, and throughput. Every row says whether host-to-device copies are in its time and whether it replays a CUDA graph. --e2e adds per-frame rows (decode, preprocess, infer, postprocess) on the same artifacts. A backend that cannot run here is a row marked skipped; exit 3 only when nothing ran. docs/runtime.md says more.

        Examples:

          enginekit bench yolo12n --random-init --batch 1,8

          enginekit bench best.pt --precision fp16 --batch 1,8,16 --json > out.json

          enginekit bench depth --random-init --imgsz 518 --plot depth.png

          enginekit bench yolo12n,depth --random-init --e2e
        """
        from enginekit import api
        from enginekit.requests import BenchRequest

        request = BenchRequest(models=model, batches=batch, input=input, imgsz=imgsz, precision=precision,
                               backends=backend, warmup=warmup, iters=iters, include_copies=include_copies,
                               threads=threads, e2e=e2e, image=image, stream=stream, source=source, every=every or [],
                               frames_per_step=frames_per_step, drop=drop, in_flight=in_flight, plot=plot_path,
                               weights=weights, random_init=random_init, seed=seed)
        quiet_third_party()
        outcome = api.bench(request)
        if as_json:
            typer.echo(json_text(outcome.to_json(), indent=2))
        else:
            for report in outcome.reports:
                _render(report)
            if outcome.e2e is not None:
                _render_e2e(outcome.e2e, outcome.image, outcome.image_hw, outcome.settings[0])
            if outcome.stream is not None:
                _render_stream(*outcome.stream)
        if outcome.plot is not None:
            from enginekit.cli.render import console

            console.print(f"  wrote {outcome.plot}")
        if not outcome.measured:
            from enginekit.errors import CapabilityError

            first = outcome.reports[0].rows[0].reason if outcome.reports[0].rows else "no backend"
            raise CapabilityError(f"no backend could run here (first reason: {first})")


def _render_stream(rows, described) -> None:
    """One row per (models, backend): the whole step's p50/p95/p99, frames/s, each model's infer p50."""
    from rich import box
    from rich.table import Table

    from enginekit.cli.render import out

    table = Table(title=f"streamed ({described}): ms per step, after warm-up", title_justify="left",
                  box=box.SIMPLE_HEAD)
    table.add_column("models", max_width=30, overflow="ellipsis", no_wrap=True)
    for col in ("backend", "decode", "infer p50 per model", "p50", "p95", "p99", "fps", "dropped"):
        table.add_column(col, justify="left" if col in ("backend", "infer p50 per model") else "right", no_wrap=True)
    for row in (r for r in rows if r.status == "ok"):
        st = row.stats
        infer = " / ".join(f"{(m['infer_ms'] or {}).get('p50', float('nan')):.1f}" for m in st["models"].values())
        f = row.frame_ms or {}
        table.add_row(" + ".join(row.models), row.backend, f"{(st.get('decode_ms') or {}).get('p50', 0):.1f}", infer,
                      *(f"{f.get(k, float('nan')):.1f}" for k in ("p50", "p95", "p99")),
                      f"{row.fps or 0:.1f}", str(sum(st["dropped"].values())))
    out.print(table)
    for row in (r for r in rows if r.status != "ok"):
        tag = "[yellow]skipped[/]" if row.status == "skipped" else "[red]failed[/]"
        out.print(f"  {tag} {' + '.join(row.models)} streamed on {row.backend}: {row.reason}")


def _render_e2e(rows, image_path, image_hw, settings) -> None:
    """Per-frame rows: stage means, percentiles, frames per second, and e2e over network-only p50."""
    from rich import box
    from rich.table import Table

    from enginekit.cli.render import out

    title = (f"end to end per frame ({image_path.name} {image_hw[0]}x{image_hw[1]}: decode, preprocess, infer, "
             f"postprocess), ms over {settings.iters} frames; e2e/net: p50 over network-only p50 at batch 1")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("model", max_width=18, overflow="ellipsis", no_wrap=True)  # the JSON has full names
    for col in ("backend", "decode", "pre", "infer", "post", "p50", "p95", "p99", "fps", "e2e/net"):
        table.add_column(col, justify="left" if col == "backend" else "right", no_wrap=True)
    for row in (r for r in rows if r.status == "ok"):
        st = row.stages_ms
        if row.kind == "model":
            pre, inf, post = (f"{st[k]:.1f}" for k in ("preprocess", "infer", "postprocess"))
        else:
            pre, inf, post = ("\n".join(f"{st[m][k]:.1f}" for m in row.models)  # one line per model
                              for k in ("preprocess", "infer", "postprocess"))
        lat = row.latency_ms
        ratio = f"{row.ratio_e2e_over_network:.2f}x" if row.ratio_e2e_over_network else "-"
        name = "\n".join(f"+ {m}" if i else m for i, m in enumerate(row.models)) if row.kind == "pipeline" \
            else row.models[0]
        table.add_row(name, row.backend, f"{st['decode']:.1f}", pre, inf, post,
                      *(f"{lat[k]:.1f}" for k in ("p50", "p95", "p99")), f"{row.throughput_fps:.1f}", ratio)
    out.print(table)
    for row in (r for r in rows if r.status == "failed" or (r.reason or "").startswith(("no batch-1", "the runtime"))):
        tag = "[yellow]skipped[/]" if row.status == "skipped" else "[red]failed[/]"
        out.print(f"  {tag} {' + '.join(row.models)} end to end on {row.backend}: {row.reason}")


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
