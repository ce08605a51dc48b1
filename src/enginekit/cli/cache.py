"""enginekit cache: list, inspect, locate and clean cached artifacts and engines."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from enginekit.cli.common import handles_errors

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")]


def register(app: typer.Typer) -> None:
    cache_app = typer.Typer(help="Inspect and clean the local cache ($ENGINEKIT_CACHE, else ~/.cache/enginekit).",
                            no_args_is_help=True)
    app.add_typer(cache_app, name="cache")

    @cache_app.command("ls")
    @handles_errors
    def ls_cmd(
        kind: Annotated[Optional[str], typer.Option("--kind", help="Only this kind (engine, onnx-export, ...).")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """List entries, most recently used first, with validity and parity.

        Example: [bold]enginekit cache ls --kind engine[/]
        """
        from enginekit.cache import Cache

        cache = Cache()
        rows = []
        for info in cache.ls():
            if kind and info.kind != kind:
                continue
            parity = None
            if info.kind == "engine" and info.valid:
                parity = cache.lookup(info.kind, info.key, verify=False).entry.manifest.get("parity", {}).get("passed")
            rows.append((info, parity))
        if as_json:
            typer.echo(json.dumps({"root": str(cache.root),
                                   "entries": [{**info.to_json(), "parity_passed": parity} for info, parity in rows]},
                                  indent=2))
            return
        from rich.table import Table

        from enginekit.cli.render import out

        table = Table(title=f"cache {cache.root}")
        for col in ("key", "kind", "subject", "size", "last used", "state", "parity"):
            table.add_column(col)
        for info, passed in rows:
            parity = {True: "[green]pass[/]", False: "[red]fail[/]"}.get(passed, "-") if info.kind == "engine" and info.valid else ""
            state = "[green]valid[/]" if info.valid else f"[red]corrupt[/] ({info.reason})"
            table.add_row(info.key[:12], info.kind, info.subject or "", _size(info.size),
                          info.last_used.strftime("%Y-%m-%d %H:%M"), state, parity)
        out.print(table)

    @cache_app.command("show")
    @handles_errors
    def show_cmd(
        key: Annotated[str, typer.Argument(help="A key or a unique prefix (6+ characters).")],
        as_json: Annotated[bool, typer.Option("--json", help="Accepted for symmetry: the manifest is JSON either way.")] = False,
    ) -> None:
        """Print an entry's manifest (JSON)."""
        from enginekit.cache import Cache

        typer.echo(json.dumps(Cache().resolve(key).manifest, indent=2, sort_keys=True))

    @cache_app.command("path")
    @handles_errors
    def path_cmd(key: Annotated[str, typer.Argument(help="A key or a unique prefix.")]) -> None:
        """Print the path of an entry's main file (engine.plan, model.onnx, ...)."""
        from enginekit.cache import Cache

        entry = Cache().resolve(key)
        files = list(entry.manifest.get("files", {}))
        main = next((f for f in ("engine.plan", "model.onnx", "calibration.cache") if f in files), None)
        typer.echo(str(entry.file(main) if main else entry.path))

    @cache_app.command("gc")
    @handles_errors
    def gc_cmd(
        max_size: Annotated[Optional[str], typer.Option("--max-size", help="Keep the cache under this size, e.g. 20G.")] = None,
        max_age: Annotated[Optional[str], typer.Option("--max-age", help="Remove entries unused for this long, e.g. 30d.")] = None,
    ) -> None:
        """Remove least recently used entries; never one in use by a running build."""
        from enginekit.cache import Cache, parse_age, parse_size
        from enginekit.cli.render import console

        # "" is a value given (and refused by the parsers), not an option left out
        removed = Cache().gc(parse_size(max_size) if max_size is not None else None,
                             parse_age(max_age) if max_age is not None else None)
        console.print(f"removed {len(removed)} entries")

    @cache_app.command("purge")
    @handles_errors
    def purge_cmd() -> None:
        """Remove every entry (entries in use are kept)."""
        from enginekit.cache import Cache
        from enginekit.cli.render import console

        removed = Cache().purge()
        console.print(f"removed {len(removed)} entries")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
