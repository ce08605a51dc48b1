"""enginekit models: the families and variants enginekit knows."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("models")
    def models_cmd() -> None:
        """List model families, their variants, default input and where weights come from.

        Example: [bold]enginekit models[/]
        """
        from rich.table import Table

        from enginekit.families import families
        from enginekit.ui import out

        table = Table(title="model families")
        for col in ("family", "variants", "default input", "weights", "note"):
            table.add_column(col)
        for f in families():
            table.add_row(f.family, "\n".join(f.variants), f.default_input, f.weights, f.note)
        out.print(table)
