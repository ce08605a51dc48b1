"""enginekit recipes ls|show, enginekit matrix, and `enginekit build RECIPE.yaml`."""

from __future__ import annotations

from enginekit.fsutil import json_text
from pathlib import Path
from typing import Annotated, Optional

import typer

from enginekit.cli.common import handles_errors, quiet_third_party
from enginekit.errors import UsageError

# build's CLI parameter -> BuildRequest name, for flags that override a recipe
_FLAG_TO_KWARG = {"profile": "profiles", "tol": "tolerances", "trt": "flavour", "backend": "flavour"}
_NOT_OVERRIDES = ("target", "trust_checkpoint", "remote", "remote_read_only", "engine")


def register(app: typer.Typer) -> None:
    recipes_app = typer.Typer(help="Recipe files: a model configuration (shapes, precisions, targets) to build.",
                              no_args_is_help=True)
    app.add_typer(recipes_app, name="recipes")

    @recipes_app.command("ls")
    @handles_errors
    def ls_cmd(
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")] = False,
    ) -> None:
        """List shipped recipes (enginekit's recipes/) and local ones (./recipes/).

        Example: [bold]enginekit recipes ls --json[/]
        """
        if as_json:
            typer.echo(json_text(recipe_rows(), indent=2))
        else:
            list_recipes_table()

    @recipes_app.command("show")
    @handles_errors
    def show_cmd(
        recipe: Annotated[str, typer.Argument(help="A recipe name (yolo12n) or a .yaml path.")],
    ) -> None:
        """Print the resolved recipe as YAML, every default filled in (itself a valid recipe).

        Example: [bold]enginekit recipes show yolo12n[/]
        """
        from enginekit.cli.render import emit

        emit(resolved_yaml(recipe))

    @app.command("matrix")
    @handles_errors
    def matrix_cmd(
        paths: Annotated[Optional[list[str]], typer.Argument(help="Recipe files, folders or names (default: every recipe `recipes ls` lists).")] = None,
        fmt: Annotated[str, typer.Option("--format", help="github: {\"include\": [...]} for strategy.matrix; json: a plain list.")] = "json",
    ) -> None:
        """Print the CI job matrix: one job per (recipe, precision, target set), as one line of JSON.

        Each job has recipe, name, precision and targets: `build RECIPE --precision P --target-cc TARGETS`, then `verify RECIPE --precision P` (docs/verify-ci.md).

        Example: [bold]enginekit matrix recipes/ --format github[/]
        """
        from enginekit.flows.recipes import matrix_jobs
        from enginekit.cli.render import emit

        if fmt not in ("github", "json"):
            raise UsageError(f"unknown --format {fmt!r}: choose github or json")
        jobs = matrix_jobs(paths or [])
        if not jobs:
            raise UsageError("no recipes found: give recipe files or folders")
        emit(json_text({"include": jobs} if fmt == "github" else jobs, separators=(",", ":")))


def recipe_rows() -> list[dict]:
    """What ``recipes ls --json`` prints: one object per recipe; an invalid one carries its error."""
    from enginekit.recipes import display_path, list_recipes, load_recipe

    rows = []
    for ref in list_recipes():
        row = {"name": ref.name, "origin": ref.origin, "path": display_path(ref.path)}
        try:
            r = load_recipe(ref.path)
        except UsageError as exc:
            rows.append({**row, "valid": False, "error": str(exc)})
            continue
        resolved = r.resolved()
        rows.append({**row, "valid": True, "model": r.model.variant, "profiles": resolved["profiles"],
                     "precisions": list(r.precisions), "targets": resolved["targets"]})
    return rows


def list_recipes_table() -> None:
    """One row per recipe; an invalid one shows its one-line error instead of its contents."""
    from rich.table import Table

    from enginekit.recipes import display_path, list_recipes, load_recipe, local_dir, shipped_dir
    from enginekit.cli.render import out

    folders = {"shipped": shipped_dir()}
    if local_dir().resolve() != shipped_dir().resolve():
        folders["local"] = local_dir()
    table = Table(title="recipes", title_justify="left",
                  caption=" · ".join(f"{k}: {display_path(v)}/" for k, v in folders.items() if v.is_dir()),
                  caption_justify="left")
    for col in ("recipe", "from", "model", "profiles", "precisions", "targets"):
        table.add_column(col, overflow="fold", no_wrap=col != "profiles")
    for ref in list_recipes():
        try:
            r = load_recipe(ref.path)
        except UsageError as exc:
            table.add_row(ref.name, ref.origin, "[red]invalid[/]", str(exc), "", "")
            continue
        resolved = r.resolved()
        table.add_row(r.name, ref.origin, r.model.variant, "\n".join(resolved["profiles"]), ", ".join(r.precisions),
                      "\n".join(resolved["targets"]))
    out.print(table)


def resolved_yaml(name_or_path: str) -> str:
    """The recipe as YAML with defaults filled in, under a comment naming its file."""
    import yaml

    from enginekit.recipes import display_path, load_recipe

    r = load_recipe(name_or_path)
    body = yaml.safe_dump(r.resolved(), sort_keys=False, default_flow_style=None, width=1000)
    header = [f"# {r.name}: {display_path(r.path)}"]
    excludes = r.adapter().int8_exclude
    if "int8" in r.precisions and excludes:
        header.append(f"# int8 also keeps the {r.adapter().family} family's defaults out of INT8: "
                      + ", ".join(excludes))
    return "\n".join(header) + "\n" + body.rstrip("\n")


def given_flags(params: dict) -> dict:
    """The build flags the user typed (not their defaults), as BuildRequest names."""
    ctx = _click_context()
    given = {}
    for name, value in params.items():
        if name == "declared":  # --task, --outputs...: over the recipe's model declaration (validated, only those given)
            if value:
                given["declared"] = dict(value)
            continue
        if name in _NOT_OVERRIDES:
            continue
        source = ctx.get_parameter_source(name) if ctx is not None else None
        if source is None or source.name == "DEFAULT":
            continue
        if name == "no_verify":
            given["verify"] = not value
        elif name == "backend":  # --trt's old name
            from enginekit.cli.common import old_backend_notice

            old_backend_notice(value)
            given["flavour"] = value
        else:
            given[_FLAG_TO_KWARG.get(name, name)] = value
    return given


def _click_context():
    """The running command's context (Typer vendors its own click in recent versions)."""
    import importlib

    for module in ("typer._click.globals", "click.globals"):
        try:
            ctx = importlib.import_module(module).get_current_context(silent=True)
        except ImportError:
            continue
        if ctx is not None:
            return ctx
    return None


def build_recipe_cmd(target: str, params: dict) -> None:
    """``enginekit build RECIPE.yaml``: every (precision, target set) of the recipe, one engine
    path per line on stdout; flags given on the command line override the file."""
    from enginekit.flows.recipes import iter_build_recipe
    from enginekit.flows.build import write_engine_file
    from enginekit.recipes import load_recipe
    from enginekit.cli.render import console, emit

    quiet_third_party()
    overrides = given_flags(params)
    output: Optional[Path] = overrides.pop("output", None)
    ultralytics = overrides.pop("ultralytics_metadata", False)
    if ultralytics and output is None:
        raise UsageError("--ultralytics-metadata with a recipe needs --output (the file YOLO() reads)")
    recipe = load_recipe(target)
    cells = recipe.cells(overrides)
    if output is not None and len(cells) > 1:
        raise UsageError(f"--output takes one engine, but {target} makes {len(cells)}: "
                         "pick one with --precision (and --target-cc)")

    def announce(r, cell, index, total):
        console.print(f"[bold]{r.name}[/] {cell.precision} for {cell.targets_label}  [dim]({index}/{total})[/]")

    for cell, outcome in iter_build_recipe(recipe, overrides, on_cell=announce):
        if outcome.manifest.get("parity", {}).get("passed") is False:
            console.print(f"[yellow]warning:[/] {recipe.name} {cell.precision}: the graph of this engine failed "
                          "its parity check (see parity.json; `enginekit verify` gates on it)")
        if output is not None:
            write_engine_file(outcome, output, ultralytics=ultralytics)
        emit(str(output or outcome.engine))
