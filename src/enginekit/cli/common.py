"""Pieces every verb shares: one-line errors with documented exit codes, shared options."""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from enginekit.errors import EnginekitError


def handles_errors(fn: Callable) -> Callable:
    """Expected failures become one red line on stderr and their exit code; no traceback.

    The verb runs with the terminal renderer listening to the library's reports, its ``--remote``
    flags applied, the cache entries it uses kept from gc (``cache.holding_entries``), and SIGTERM
    handled as Ctrl-C is (temporary files removed), then exit 143 where Ctrl-C gives 130. A full
    disk is one line and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from enginekit import reporting
        from enginekit.cache import holding_entries
        from enginekit.cli.render import RichReporter, console
        from enginekit.errors import Terminated
        from enginekit.store.settings import using

        try:
            with reporting.using(RichReporter()), _trust(kwargs.get("trust_checkpoint", False)), \
                    using(kwargs.get("remote"), read_only=bool(kwargs.get("remote_read_only"))), \
                    holding_entries(), _sigterm_interrupts():
                return fn(*args, **kwargs)
        except EnginekitError as exc:
            print_error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except ImportError as exc:  # a library the step needs is missing or broken: an install problem
            from enginekit.errors import CapabilityError

            missing = getattr(exc, "name", None) or "a library"
            print_error(f"cannot import {missing}, which this step needs: {exc} (`enginekit doctor` lists what is installed)")
            raise typer.Exit(CapabilityError.exit_code) from None
        except Terminated:
            raise typer.Exit(Terminated.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except Exception as exc:
            from enginekit.fsutil import is_disk_full

            if not is_disk_full(exc):
                raise
            where = getattr(exc, "filename", None)
            print_error(f"no space left on the device{f' writing {where}' if where else ''}: nothing was kept; "
                        "free some space (enginekit cache gc --max-size ...) or write elsewhere (ENGINEKIT_CACHE, -o)")
            raise typer.Exit(2) from None

    return wrapper


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises ``Terminated`` in the main thread while the verb runs."""
    import signal
    import threading

    from enginekit.errors import Terminated

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _trust(trusted: bool):
    """``--trust-checkpoint``: Ultralytics pickles load with Ultralytics' own unpickler."""
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
RemoteOpt = Annotated[Optional[str], typer.Option(
    "--remote", help="The team store under the local cache: s3://BUCKET/PREFIX (endpoint, region and credentials "
                     "from the standard AWS settings) or file:///PATH; default $ENGINEKIT_REMOTE, 'none' for no store.")]
RemoteReadOnlyOpt = Annotated[bool, typer.Option(
    "--remote-read-only", help="Read from the store, never write to it (also ENGINEKIT_REMOTE_MODE=read).")]
