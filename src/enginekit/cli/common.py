"""Pieces every verb shares: one-line errors with documented exit codes, shared options."""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from enginekit.errors import EnginekitError
from enginekit.options import (DECLARATION, ENGINE, NMS, OPSET, PANEL_BUILD, PANEL_CALIB, PANEL_GATES, PANEL_IMAGES, PANEL_INPUT,
                               PANEL_MODEL, PANEL_REPORTS, PANEL_RUN, PANEL_STORE, PANEL_STREAM, PROFILES, RANDOM_INIT,
                               SEED, TRT, WEIGHTS, Option)


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
            with reporting.using(RichReporter()), reporting.library_logs(), \
                    _trust(kwargs.get("trust_checkpoint", False)), \
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
    # "and N more" counts the checks left out (a group lists several artifacts' one check), as the count before
    # it counts checks: "5 check(s) failed: a; b, c: d; e; and 1 more check"
    rest = sum(len(artifacts) for artifacts in list(groups.values())[shown:])
    more = f"; and {rest} more check{'s' if rest != 1 else ''}" if rest else ""
    return "; ".join(items[:shown]) + more


def quiet_third_party() -> None:
    """Keep library chatter (Ultralytics banners, tracer warnings) off the terminal."""
    import logging
    import warnings

    os.environ.setdefault("YOLO_VERBOSE", "False")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore")
    for name in ("ultralytics", "modelopt", "transformers", "onnxsim", "torch.onnx"):
        logging.getLogger(name).setLevel(logging.ERROR)


def cli_option(option: Option) -> Any:
    """The Typer option of ``option`` (options.py: flags, help, panel), as a parameter's annotation; a list option
    repeats its flag (``--exclude A --exclude B``) and is None when not given."""
    kind = Optional[option.type] if getattr(option.type, "__origin__", None) is list else option.type
    return Annotated[kind, typer.Option(*option.flags, rich_help_panel=option.panel, help=option.help,
                                        hidden=option.hidden)]


def cli_default(option: Option) -> Any:
    """The default of ``option``'s parameter: a list's is None (not given), the request's default applies."""
    return None if isinstance(option.default, list) else option.default


ImgszOpt = Annotated[Optional[str], typer.Option(
    "--imgsz", rich_help_panel=PANEL_INPUT, help="Input size N or HxW (Ultralytics' imgsz), batch 1.")]
WeightsOpt = cli_option(WEIGHTS)
TrustOpt = Annotated[bool, typer.Option(
    "--trust-checkpoint", rich_help_panel=PANEL_MODEL,
    help="Load a .pt outside the allowlist (runs its code: docs/models.md).")]
RandomInitOpt = cli_option(RANDOM_INIT)
SeedOpt = cli_option(SEED)
OpsetOpt = cli_option(OPSET)
ForceOpt = Annotated[bool, typer.Option("--force", rich_help_panel=PANEL_RUN, help="Rebuild even on a cache hit.")]
NmsOpt = cli_option(NMS)
RemoteOpt = Annotated[Optional[str], typer.Option(
    "--remote", rich_help_panel=PANEL_STORE,
    help="Team store s3://BUCKET/PREFIX or file:///PATH ('none': off).")]
RemoteReadOnlyOpt = Annotated[bool, typer.Option(
    "--remote-read-only", rich_help_panel=PANEL_STORE, help="Read the store, never write it.")]

ModelsWeightsOpt = Annotated[Optional[list[Path]], typer.Option(
    "--weights", "-w", rich_help_panel=PANEL_MODEL, help="Weights, once per model, in the order of MODELS.")]
ImagesOpt = Annotated[Optional[Path], typer.Option(
    "--images", rich_help_panel=PANEL_IMAGES, help="Folder of photographs to check on (default: embedded).")]
RecheckOpt = Annotated[bool, typer.Option(
    "--recheck", rich_help_panel=PANEL_GATES, help="Check again, though a verdict on the same content is stored.")]

# A stream of frames (predict; bench --stream; tune): one declaration each.
EveryOpt = Annotated[Optional[list[str]], typer.Option(
    "--every", rich_help_panel=PANEL_STREAM, help="A model's cadence in the pipeline, MODEL=N (depth=3); repeatable.")]
FramesPerStepOpt = Annotated[int, typer.Option(
    "--frames-per-step", rich_help_panel=PANEL_STREAM,
    help="K frames per step, batched (stereo: 2; K cameras: K); latency is per step.")]
DropOpt = Annotated[str, typer.Option(
    "--drop", rich_help_panel=PANEL_STREAM, help="Too many frames: none (wait), oldest or newest dropped.")]
InFlightOpt = Annotated[int, typer.Option(
    "--in-flight", rich_help_panel=PANEL_STREAM, help="Steps at once: 1 least latency, 2 stages overlap.")]

# What building an engine takes (build's options; verify takes the same to find or build the engine build would):
# declared once in options.py (ENGINE), added to a command by ``builds_an_engine``.
ProfileOpt = cli_option(PROFILES)
OldBackendOpt = Annotated[Optional[str], typer.Option("--backend", hidden=True, help="--trt's old name (this release only).")]

#: build's builder and calibration options, (parameter, annotation, default, BuildRequest field), in help's order
ENGINE_OPTIONS = ((TRT.parameter, cli_option(TRT), cli_default(TRT), TRT.field),
                  ("backend", OldBackendOpt, None, "flavour"),
                  *((o.parameter, cli_option(o), cli_default(o), o.field) for o in ENGINE[1:]))

MODEL_HELP = ("yolo12n, depth, best.pt, torchvision:NAME, timm:NAME, file.py:factory, module:factory or a "
              ".pt2/TorchScript program (docs/models.md).")


#: the model declaration's options (options.DECLARATION), (parameter, annotation, default), in the order help lists them
DECLARATION_OPTIONS = tuple((o.parameter, cli_option(o), cli_default(o)) for o in DECLARATION)


def declares_a_model(fn: Callable) -> Callable:
    """A command that takes the model declaration (``--task`` ... ``--classes``, DECLARATION_OPTIONS) without
    listing its options: they are added to its signature here, and ``fn`` gets ``declared`` (validated; {} if
    none) in their place. Put it under ``@handles_errors``."""
    return _adds_options(fn, "declared", DECLARATION_OPTIONS, declared_of)


def builds_an_engine(fn: Callable) -> Callable:
    """A command that takes build's builder and calibration options (``--trt`` ... ``--exclude``,
    ENGINE_OPTIONS) without listing them: they are added to its signature here, and ``fn`` gets ``engine`` (the
    values by parameter name, as typed: ``engine_request`` makes BuildRequest fields of them) in their place."""
    return _adds_options(fn, "engine", [(name, annotation, default) for name, annotation, default, _ in ENGINE_OPTIONS],
                         lambda given: given)


def engine_request(engine: dict) -> dict:
    """BuildRequest fields from ``builds_an_engine``'s values: ``--backend`` (the old name of ``--trt``) said once
    and read as ``--trt``."""
    options = {field: engine[name] for name, _, _, field in ENGINE_OPTIONS if name != "backend"}
    old = engine.get("backend")
    if old is not None:
        from enginekit.errors import UsageError

        if engine.get("trt", "auto") not in ("auto", old):
            raise UsageError(f"--backend {old} and --trt {engine['trt']} disagree: give --trt only (--backend is its old name)")
        old_backend_notice(old)
        options["flavour"] = old
    options["exclude"] = list(options["exclude"] or [])
    return options


def old_backend_notice(old: str) -> None:
    """``--backend`` given to build or verify: said once, read as ``--trt`` (a value no flavour has: the one error
    line, no warning before it)."""
    from enginekit import reporting
    from enginekit.errors import UsageError
    from enginekit.trt.flavours import FLAVOURS

    if old not in FLAVOURS:
        raise UsageError(f"unknown TensorRT flavour {old!r}: choose {', '.join(FLAVOURS)} (--backend is --trt's old name)")
    reporting.warning(f"--backend on build and verify names the TensorRT that builds: it is --trt now (--trt {old}); "
                      "--backend goes in a later release")


def _adds_options(fn: Callable, into: str, options, convert: Callable) -> Callable:
    """``fn`` with ``options`` ((parameter, annotation, default)) added to its signature as keyword options, and
    the values given for them passed to it as one argument ``into`` (``convert(values)``)."""
    import inspect

    sig = inspect.signature(fn, eval_str=True)  # the command's own annotations as objects (Annotated options)
    kept = [p for p in sig.parameters.values() if p.name != into]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
             for name, annotation, default in options]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        given = {name: kwargs.pop(name, default) for name, _, default in options}
        return fn(*args, **{into: convert(given)}, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=kept + added)
    wrapper.__annotations__ = {**{p.name: p.annotation for p in kept},
                               **{name: annotation for name, annotation, _ in options}}
    return wrapper


def declared_of(options: dict) -> dict:
    """The model declaration among a verb's options (``--task``, ``--outputs``...), validated; {} if none."""
    from enginekit.families.torch_models.spec import FLAGS, declaration

    return declaration(**{k: options.get(k) for k in (*FLAGS, "bgr") if k in options})
