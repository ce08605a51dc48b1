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
            with reporting.using(RichReporter()), _trust(kwargs.get("trust_checkpoint", False)):
                return fn(*args, **kwargs)
        except EnginekitError as exc:
            print_error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except ImportError as exc:  # a library the step needs is missing or broken: an install problem
            from enginekit.errors import CapabilityError

            missing = getattr(exc, "name", None) or "a library"
            print_error(f"cannot import {missing}, which this step needs: {exc} (`enginekit doctor` lists what is installed)")
            raise typer.Exit(CapabilityError.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return wrapper


def _trust(trusted: bool):
    """``--trust-checkpoint``: Ultralytics pickles load with Ultralytics' own unpickler."""
    import contextlib

    if not trusted:
        return contextlib.nullcontext()
    from enginekit.families.checkpoints import trusting

    return trusting(True)


def error_text(message: str) -> str:
    """``message`` as one line: control characters (newlines, escapes) shown, not obeyed."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def print_error(message: str) -> None:
    """The one ``error:`` line on stderr. The message is printed as given: no rich markup, no
    ``:emoji:`` codes (a profile ``a:b:c:d`` stays ``a:b:c:d``), no wrapping."""
    from rich.text import Text

    from enginekit.cli.render import console

    line = Text("error:", style="bold red")
    line.append(" " + error_text(message))
    console.print(line, soft_wrap=True, highlight=False, emoji=False, markup=False)


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
             "transformers .safetensors/.pth or model folder. Ultralytics .pt files are pickles: they are "
             "read with PyTorch's weights-only unpickler and an allowlist of the classes Ultralytics "
             "checkpoints are made of, and a file naming anything else is refused (see --trust-checkpoint).",
    ),
]
TrustOpt = Annotated[
    bool,
    typer.Option(
        "--trust-checkpoint",
        help="Load an Ultralytics .pt that names classes outside the allowlist with Ultralytics' own "
             "loader, which runs code from the file: only for a checkpoint you trust "
             "(also ENGINEKIT_TRUST_CHECKPOINTS=1).",
    ),
]
RandomInitOpt = Annotated[
    bool, typer.Option("--random-init", help="Build the architecture with seeded random weights (no download).")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of --random-init and of random test inputs.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Rebuild even when the cache has the result.")]
NmsOpt = Annotated[bool, typer.Option(
    "--nms", help="Detectors: NMS in the graph, as Ultralytics' nms=True (per class, conf 0.25, IoU 0.7, 300 kept boxes).")]
