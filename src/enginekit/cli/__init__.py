"""The ``enginekit`` command. Thin: flags -> a request -> the API, its reports rendered on stderr.

Heavy imports live in the verbs.
"""

from __future__ import annotations

import typer

from enginekit import __version__

app = typer.Typer(
    name="enginekit",
    help=(
        "PyTorch vision models (YOLO, Depth-Anything-V2) to verified TensorRT engines.\n\n"
        "Exit codes: 0 ok; 1 a parity gate failed; 2 bad usage or input; "
        "3 a capability asked for is missing (GPU, TensorRT)."
    ),
    no_args_is_help=True,
    add_completion=False,
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
) -> None:
    pass


def _register() -> None:
    from enginekit.cli import bench, build, cache, doctor, export, models, recipes, simplify, verify

    for module in (models, export, simplify, build, cache, verify, bench, doctor, recipes):
        module.register(app)
    __import__("enginekit.cli.predict", fromlist=["register"]).register(app)  # runtime verb (issue 9)


_register()


def main() -> None:
    app()
