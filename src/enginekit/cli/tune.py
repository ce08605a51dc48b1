"""enginekit tune: the backend, precision, input size and batch that meet a frame budget here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import declares_a_model, ModelsWeightsOpt, EveryOpt, FramesPerStepOpt, RandomInitOpt, RemoteOpt, RemoteReadOnlyOpt, SeedOpt, TrustOpt, handles_errors, quiet_third_party


def register(app: typer.Typer) -> None:
    @app.command("tune")
    @handles_errors
    @declares_a_model
    def tune_cmd(
        models: Annotated[str, typer.Argument(help="Model name(s), comma-separated (yolo12n,depth): several run on every frame.")],
        weights: ModelsWeightsOpt = None,
        random_init: RandomInitOpt = False,
        trust_checkpoint: TrustOpt = False,
        seed: SeedOpt = 0,
        p50: Annotated[Optional[str], typer.Option("--p50", help="Target: the step's median latency, in ms (25 or 25ms).")] = None,
        p95: Annotated[Optional[str], typer.Option("--p95", help="Target: the step's 95th percentile latency, in ms.")] = None,
        p99: Annotated[Optional[str], typer.Option("--p99", help="Target: the step's 99th percentile latency, in ms.")] = None,
        fps: Annotated[Optional[float], typer.Option("--fps", help="Target: frames per second the stream sustains.")] = None,
        frames_per_step: FramesPerStepOpt = 1,
        every: EveryOpt = None,
        backend: Annotated[Optional[list[str]], typer.Option("--backend", help="Search space: runtime backends, comma list (default: those that run here; on a GPU tensorrt, onnxruntime-cuda, torch; on a CPU onnxruntime-cpu).")] = None,
        precision: Annotated[Optional[list[str]], typer.Option("--precision", help="Search space: precisions, comma list (default: fp16,fp32 on a GPU, fp32 on a CPU).")] = None,
        input: Annotated[Optional[list[str]], typer.Option("--input", "-i", "--imgsz", help="Search space: network input sizes, comma list: 320 or HxW for every model, MODEL=SIZE for one (yolo12n=320,depth=224); default: the family's.")] = None,
        batch: Annotated[Optional[list[str]], typer.Option("--batch", "-b", help="Search space: frames per inference call, comma list, at most --frames-per-step (default: --frames-per-step).")] = None,
        budget: Annotated[Optional[float], typer.Option("--budget", help="Minutes to spend: no candidate starts once it would end past them.")] = None,
        source: Annotated[Optional[str], typer.Option("--source", help="Frames to time on: a video, a folder or a camera (default: a 1280x720 video made from the embedded photographs).")] = None,
        frames: Annotated[int, typer.Option("--frames", help="Steps timed per candidate.")] = 60,
        device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda:N (default: the backend's).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print every candidate and the choice as JSON on stdout.")] = False,
        write_recipe: Annotated[Optional[Path], typer.Option("--write-recipe", help="Write the choice as a recipe: FILE.yaml (one model) or a folder (one MODEL.yaml per model).")] = None,
        remote: RemoteOpt = None,
        remote_read_only: RemoteReadOnlyOpt = False,
        declared: dict = None,
    ) -> None:
        """Find the settings that meet a frame budget on this machine, each one built, verified and timed.

        Candidates (backend x precision x input x batch per model) are built through the cache, verified (one failing its gates is out, with the reason) and streamed end to end through the runtime (decode, preprocess, infer, postprocess). The search goes cheapest first, leaves out what a cheaper setting already misses, and keeps to --budget. The choice meets every target, then has the best accuracy, then the most frames per second. Nothing meets: exit 1 and one line with the best figures reached.

        Examples:

          enginekit tune yolo12n --random-init --p99 25ms --fps 60

          enginekit tune yolo12n,depth --random-init --p99 25ms --every depth=3

          enginekit tune best.pt --imgsz 320,640 --p50 40 --write-recipe tuned/
        """
        from enginekit.runtime.stream import parse_every

        from enginekit.requests import TuneRequest

        request = TuneRequest(models=models, weights=weights or [], random_init=random_init, seed=seed, p50=p50,
                              p95=p95, p99=p99, fps=fps, frames_per_step=frames_per_step, every=parse_every(every),
                              backends=backend or [], precisions=precision or [], inputs=input or [],
                              batches=batch or [], budget_minutes=budget, source=source, frames=frames,
                              device=device, write_recipe=write_recipe, declared=declared)
        quiet_third_party()
        from enginekit import api

        outcome = api.tune(request)
        _render(outcome, as_json)
        if not outcome.met:
            from enginekit.errors import TargetMissed

            raise TargetMissed(outcome.best_line())


def _render(outcome, as_json: bool) -> None:
    from enginekit.cli.render import emit, out

    if as_json:
        emit(json.dumps(outcome.to_json(), indent=2))
        return
    out.print(table(outcome))
    if outcome.chosen is not None:
        out.print(f"chosen: {outcome.chosen.label()}")
    for path in outcome.recipes:
        emit(str(path))


def table(outcome):
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"tune: {outcome.targets.describe()}; ms per step over {outcome.source}", title_justify="left",
              box=box.SIMPLE_HEAD)
    for col in ("candidate", "p50", "p95", "p99", "frames/s", "GPU MiB", "verify", "verdict"):
        t.add_column(col, justify="left" if col in ("candidate", "verify", "verdict") else "right",
                     overflow="fold", no_wrap=col not in ("candidate", "verdict"))
    for c in outcome.candidates:
        m = c.measured
        fig = (lambda v: "-" if v is None else f"{v:.1f}")
        verdict = ("[bold green]chosen[/]" if c.chosen else {"meets": "[green]meets[/]", "misses": "[yellow]misses[/]",
                   "out": "[red]out[/]", "failed": "[red]failed[/]"}.get(c.verdict, c.verdict))
        if c.reason:
            verdict += f": {escape(c.reason)}"
        t.add_row(escape("\n".join(s.label() for s in c.settings)),
                  *(fig(getattr(m, k)) if m else "-" for k in ("p50_ms", "p95_ms", "p99_ms", "fps", "peak_gpu_mib")),
                  escape(m.accuracy) if m else "-", verdict)
    return t
