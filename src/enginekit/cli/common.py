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


def failure_summary(failures: list[str], shown: int = 3) -> str:
    """Failed checks (``"artifact: check = value (limit ...)"``) for one error line: a check that failed
    alike on several artifacts (a reference with nothing to compare fails every graph the same way)
    is said once, with the artifacts it failed on; at most ``shown`` of them, then how many more."""
    groups: dict[str, list[str]] = {}
    for text in failures:
        artifact, sep, what = str(text).partition(": ")
        if not sep:
            artifact, what = "", artifact
        groups.setdefault(what, []).append(artifact)
    items = [f"{', '.join(a for a in dict.fromkeys(artifacts) if a)}: {what}" if any(artifacts) else what
             for what, artifacts in groups.items()]
    return "; ".join(items[:shown]) + (f"; and {len(items) - shown} more" if len(items) > shown else "")


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

# What a model enginekit cannot know by itself declares (torchvision:, timm:, file.py:factory, programs):
# the same names in a recipe's model: section and as keywords of enginekit.load.
_DECLARE = "Model declaration"
TaskOpt = Annotated[Optional[str], typer.Option(
    "--task", rich_help_panel=_DECLARE,
    help="What the model's first output serves: semantic (per-pixel class logits), classify (class logits or "
         "probabilities), depth, or raw (parity only). torchvision's and timm's common heads come declared.")]
OutputsOpt = Annotated[Optional[str], typer.Option(
    "--outputs", rich_help_panel=_DECLARE,
    help="Output names in order, each NAME[:MEANING] (logits, probabilities, depth, values), e.g. out:logits,aux:logits; "
         "dict outputs by key (a subset keeps those), tuples by position. Default: as the model returns them.")]
SizeOpt = Annotated[Optional[str], typer.Option(
    "--size", rich_help_panel=_DECLARE, help="The model's input H x W when no --input/--profile says (e.g. 512x512).")]
DynamicOpt = Annotated[Optional[str], typer.Option(
    "--dynamic", rich_help_panel=_DECLARE,
    help="Input axes kept symbolic in the graph besides batch (always): hw (height and width) or none. "
         "Default: none for a model no table row declares.")]
MeanOpt = Annotated[Optional[str], typer.Option(
    "--mean", rich_help_panel=_DECLARE, help="Per-channel mean of 0..1 pixels subtracted, e.g. 0.485,0.456,0.406.")]
StdOpt = Annotated[Optional[str], typer.Option(
    "--std", rich_help_panel=_DECLARE, help="Per-channel standard deviation divided by, e.g. 0.229,0.224,0.225.")]
ResizeOpt = Annotated[Optional[str], typer.Option(
    "--resize", rich_help_panel=_DECLARE,
    help="How a photograph becomes H x W: stretch, letterbox (grey 114 bars) or crop (shorter side, centre crop).")]
BgrOpt = Annotated[bool, typer.Option("--bgr", rich_help_panel=_DECLARE, help="The model takes BGR channels (default RGB).")]
ClassesOpt = Annotated[Optional[int], typer.Option(
    "--classes", rich_help_panel=_DECLARE, help="torchvision/timm: build the model with this many classes.")]
MODEL_HELP = ("Model: yolo12n, depth, ...; torchvision:NAME, timm:NAME; path/to/file.py:factory or "
              "package.module:factory (imports that code and calls the factory: it runs, as `python file.py` "
              "would); a torch.export .pt2 or TorchScript program (runs code from the file: needs "
              "--trust-checkpoint).")


def declared_of(options: dict) -> dict:
    """The model declaration among a verb's options (``--task``, ``--outputs``...), validated; {} if none."""
    from enginekit.families.torch_models.spec import FLAGS, declaration

    return declaration(**{k: options.get(k) for k in (*FLAGS, "bgr") if k in options})
