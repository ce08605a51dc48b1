"""enginekit models: the families and variants enginekit knows."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("models")
    def models_cmd(
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")] = False,
    ) -> None:
        """List model families, their task, variants, default input and where weights come from.

        Example: [bold]enginekit models --json[/]
        """
        from enginekit.families import families

        if as_json:
            import dataclasses
            from enginekit.fsutil import json_text

            typer.echo(json_text([dataclasses.asdict(f) for f in families()], indent=2))
            return
        from rich.table import Table

        from enginekit.cli.render import out

        table = Table(title="model families")
        for col in ("family", "task", "variants", "default input", "weights", "note"):
            table.add_column(col, no_wrap=col in ("family", "task", "variants"))
        for f in families():
            table.add_row(f.family, f.task, "\n".join(f.variants), f.default_input, f.weights, f.note)
        out.print(table)
