"""rich renderings shared by verbs."""

from __future__ import annotations

from rich import box
from rich.table import Table

from enginekit.ui import console


def parity_table(results) -> None:
    """One row per artifact x output: worst errors over all inputs, against tolerance."""
    table = Table(title="parity vs FP32 PyTorch (ONNX Runtime CPU)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("graph", "output", "n", "max abs", "rel L2", "cosine", "limit", "gate"):
        table.add_column(col, justify="left" if col in ("graph", "output", "gate") else "right", no_wrap=True)
    for r in results:
        limit = f"{r.tolerance.rel_l2:.0e}"
        gate = "[green]pass[/]" if r.passed else "[bold red]FAIL[/]"
        for name, w in r.worst().items():
            table.add_row(f"{r.artifact} {r.precision}", name, str(len(r.cases)), f"{w['max_abs']:.2e}",
                          f"{w['rel_l2']:.2e}", f"{w['cosine']:.6f}", limit, gate)
    console.print(table)
