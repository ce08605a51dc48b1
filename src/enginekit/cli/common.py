"""Pieces every verb shares: one-line errors with documented exit codes, shared options."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from enginekit.errors import EnginekitError


def handles_errors(fn: Callable) -> Callable:
    """Expected failures become one red line on stderr and their exit code; no traceback.

    The verb runs with the terminal renderer listening to the library's reports."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from enginekit import reporting
        from enginekit.cli.render import RichReporter, console

        try:
            with reporting.using(RichReporter()):
                return fn(*args, **kwargs)
        except EnginekitError as exc:
            console.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper


def quiet_third_party() -> None:
    """Keep library chatter (Ultralytics banners, tracer warnings) off the terminal."""
    import logging
    import warnings

    os.environ.setdefault("YOLO_VERBOSE", "False")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore")
    for name in ("ultralytics", "modelopt", "transformers", "onnxsim", "torch.onnx"):
        logging.getLogger(name).setLevel(logging.ERROR)


WeightsOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--weights", "-w",
        help="Local weights: an Ultralytics .pt, or for Depth-Anything-V2 an original-repo .pth, a "
             "transformers .safetensors/.pth or model folder. Ultralytics .pt files are pickles: "
             "loading one runs code from the file, so load only checkpoints you trust "
             "(state dicts and safetensors load safely).",
    ),
]
RandomInitOpt = Annotated[
    bool, typer.Option("--random-init", help="Build the architecture with seeded random weights (no download).")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of --random-init and of random test inputs.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Rebuild even when the cache has the result.")]
