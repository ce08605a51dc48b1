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


# Help panels by concern, shared by every verb (``--help`` at 80 columns: one short line per option; the details
# live in docs/, which says where)
PANEL_MODEL = "Model and weights"
PANEL_INPUT = "Input"
PANEL_BUILD = "Precision and build"
PANEL_CALIB = "Calibration (INT8)"
PANEL_GATES = "Gates"
PANEL_IMAGES = "Images and labels"
PANEL_REPORTS = "Reports"
PANEL_STORE = "Team store"
PANEL_RUN = "Running"
PANEL_STREAM = "Stream"

ImgszOpt = Annotated[Optional[str], typer.Option(
    "--imgsz", rich_help_panel=PANEL_INPUT, help="Input size N or HxW (Ultralytics' imgsz), batch 1.")]
WeightsOpt = Annotated[Optional[Path], typer.Option(
    "--weights", "-w", rich_help_panel=PANEL_MODEL,
    help="Local weights: .pt, .pth, .safetensors or a model folder (docs/models.md).")]
TrustOpt = Annotated[bool, typer.Option(
    "--trust-checkpoint", rich_help_panel=PANEL_MODEL,
    help="Load a .pt outside the allowlist (runs its code: docs/models.md).")]
RandomInitOpt = Annotated[bool, typer.Option(
    "--random-init", rich_help_panel=PANEL_MODEL, help="Seeded random weights (no download).")]
SeedOpt = Annotated[int, typer.Option("--seed", rich_help_panel=PANEL_MODEL, help="Seed of --random-init and test inputs.")]
ForceOpt = Annotated[bool, typer.Option("--force", rich_help_panel=PANEL_RUN, help="Rebuild even on a cache hit.")]
NmsOpt = Annotated[bool, typer.Option(
    "--nms", rich_help_panel=PANEL_MODEL, help="NMS in the graph, as Ultralytics' nms=True (detectors).")]
RemoteOpt = Annotated[Optional[str], typer.Option(
    "--remote", rich_help_panel=PANEL_STORE,
    help="Team store s3://BUCKET/PREFIX or file:///PATH ('none': off).")]
RemoteReadOnlyOpt = Annotated[bool, typer.Option(
    "--remote-read-only", rich_help_panel=PANEL_STORE, help="Read the store, never write it.")]

# What a model enginekit cannot know by itself declares (torchvision:, timm:, file.py:factory, programs):
# the same names in a recipe's model: section and as keywords of enginekit.load (docs/models.md).
_DECLARE = "Model declaration (torchvision:, timm:, file.py:factory)"
TaskOpt = Annotated[Optional[str], typer.Option(
    "--task", rich_help_panel=_DECLARE, help="semantic, classify, depth or raw (parity only).")]
OutputsOpt = Annotated[Optional[str], typer.Option(
    "--outputs", rich_help_panel=_DECLARE, help="NAME[:MEANING],... e.g. out:logits,aux:logits.")]
SizeOpt = Annotated[Optional[str], typer.Option(
    "--size", rich_help_panel=_DECLARE, help="Input HxW when no --input/--profile says.")]
DynamicOpt = Annotated[Optional[str], typer.Option(
    "--dynamic", rich_help_panel=_DECLARE, help="Symbolic axes besides batch: hw or none.")]
MeanOpt = Annotated[Optional[str], typer.Option(
    "--mean", rich_help_panel=_DECLARE, help="Per-channel mean of 0..1 pixels, e.g. 0.485,0.456,0.406.")]
StdOpt = Annotated[Optional[str], typer.Option(
    "--std", rich_help_panel=_DECLARE, help="Per-channel std, e.g. 0.229,0.224,0.225.")]
ResizeOpt = Annotated[Optional[str], typer.Option(
    "--resize", rich_help_panel=_DECLARE, help="stretch, letterbox (grey 114) or crop.")]
BgrOpt = Annotated[bool, typer.Option("--bgr", rich_help_panel=_DECLARE, help="The model takes BGR (default RGB).")]
ClassesOpt = Annotated[Optional[int], typer.Option(
    "--classes", rich_help_panel=_DECLARE, help="torchvision/timm: this many classes.")]
MODEL_HELP = ("yolo12n, depth, best.pt, torchvision:NAME, timm:NAME, file.py:factory, module:factory or a "
              ".pt2/TorchScript program (docs/models.md).")


#: the model declaration's options, (parameter, annotation, default), in the order help lists them
DECLARATION_OPTIONS = (("task", TaskOpt, None), ("outputs", OutputsOpt, None), ("size", SizeOpt, None),
                       ("dynamic", DynamicOpt, None), ("mean", MeanOpt, None), ("std", StdOpt, None),
                       ("resize", ResizeOpt, None), ("bgr", BgrOpt, False), ("classes", ClassesOpt, None))


def declares_a_model(fn: Callable) -> Callable:
    """A command that takes the model declaration (``--task`` ... ``--classes``, DECLARATION_OPTIONS) without
    listing its options: they are added to its signature here, and ``fn`` gets ``declared`` (validated; {} if
    none) in their place. Put it under ``@handles_errors``."""
    import inspect

    sig = inspect.signature(fn, eval_str=True)  # the command's own annotations as objects (Annotated options)
    kept = [p for p in sig.parameters.values() if p.name != "declared"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
             for name, annotation, default in DECLARATION_OPTIONS]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        given = {name: kwargs.pop(name, default) for name, _, default in DECLARATION_OPTIONS}
        return fn(*args, declared=declared_of(given), **kwargs)

    wrapper.__signature__ = sig.replace(parameters=kept + added)
    wrapper.__annotations__ = {**{p.name: p.annotation for p in kept},
                               **{name: annotation for name, annotation, _ in DECLARATION_OPTIONS}}
    return wrapper


def declared_of(options: dict) -> dict:
    """The model declaration among a verb's options (``--task``, ``--outputs``...), validated; {} if none."""
    from enginekit.families.torch_models.spec import FLAGS, declaration

    return declaration(**{k: options.get(k) for k in (*FLAGS, "bgr") if k in options})
