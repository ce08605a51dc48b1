"""The ``enginekit`` command. Thin: flags -> a request -> the API, its reports rendered on stderr.

Heavy imports live in the verbs: ``enginekit --help`` imports every command module, so the library (api, flows,
requests, and what they import: numpy, pydantic, onnx...) is imported inside each command's function, where every
other package imports at its top (tests/test_layout.py reads function-local imports all the same).
"""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup, TyperOption

from enginekit._version import __version__


class _Enginekit(TyperGroup):
    """The root command. Click's own usage errors (an unknown option, a value that is not an
    integer, an extra argument) become one ``error:`` line and exit 2, like every refusal of
    enginekit's own; ``--help`` and ``--version`` are unchanged."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except typer.TyperException as exc:  # Click's errors: usage, bad parameter, file
            ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:  # a bare group: its help, once
                text = exc.format_message()  # rich help printed itself when the error was made; plain help is here
                if text.strip():
                    typer.echo(text)
                code = 2  # a bare `enginekit`, `cache` or `recipes` names no command: usage, as Click has it
            else:
                from enginekit.cli.common import print_error

                print_error(_click_message(exc))
                code = 2
        except typer.Abort:
            from enginekit.cli.common import print_error

            print_error("interrupted")
            code = 130
        if standalone_mode:
            sys.exit(code)
        return code


def _click_message(exc) -> str:
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    if ctx is not None and ctx.command_path:
        message += f" (see {ctx.command_path} --help)"
    return message


def _no_type(self, ctx):
    """Help shows no type column (``<str>``, ``<path>``: the help line says what an option takes), so that at 80
    columns an option's name and its one line of help fit side by side."""
    return None


TyperOption.display_type_rich = _no_type


app = typer.Typer(
    cls=_Enginekit,
    name="enginekit",
    help=(
        "PyTorch vision models (YOLO, Depth-Anything-V2) to verified TensorRT engines.\n\n"
        "Exit codes: 0 ok; 1 a parity gate failed; 2 bad usage or input; "
        "3 a capability asked for is missing (GPU, TensorRT)."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"enginekit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    verbose: bool = typer.Option(False, "--verbose", help="Show what libraries log (ModelOpt, Ultralytics...): "
                                 "ENGINEKIT_VERBOSE=1 too."),
) -> None:
    if verbose:
        import os

        os.environ["ENGINEKIT_VERBOSE"] = "1"


def _register() -> None:
    from enginekit.cli import bench, build, cache, doctor, export, models, recipes, simplify, verify

    for module in (models, export, simplify, build, cache, verify, bench, doctor, recipes):
        module.register(app)
    __import__("enginekit.cli.predict", fromlist=["register"]).register(app)  # runtime verb (issue 9)
    __import__("enginekit.cli.tune", fromlist=["register"]).register(app)  # settings for a frame budget (issue 18)
    __import__("enginekit.cli.deploy", fromlist=["register"]).register(app)  # a Triton model repository


_register()


def main() -> None:
    if _closed(sys.stdout):  # `enginekit ... >&-`: results have nowhere to go
        if not _closed(sys.stderr):
            sys.stderr.write("error: standard output is closed: redirect it (> file, or >/dev/null) instead of "
                             "closing it\n")
        sys.exit(2)
    app()


def _closed(stream) -> bool:
    """Whether ``stream`` cannot be written: the shell closed its descriptor (Python then makes it None)."""
    import io
    import os

    if stream is None:
        return True
    try:
        fd = stream.fileno()
    except (AttributeError, io.UnsupportedOperation):
        return False  # no descriptor (a test's buffer): writable as far as anyone can tell
    except ValueError:
        return True  # a closed file object
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False
