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


def verify_table(report) -> None:
    """One row per artifact: what ran, the worst figures, and the gate."""
    table = Table(title=f"verify {report.subject} {report.precision}  (references {report.references_key[:10]}: "
                        f"{'stored' if report.references_status == 'hit' else 'computed'})",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("artifact", "ran", "rel L2", "cosine", "task", "gate"):
        table.add_column(col, no_wrap=col not in ("task", "gate"), overflow="fold")
    for a in report.artifacts:
        if not a.ran:
            table.add_row(a.name, "[yellow]no[/]", "", "", a.reason, "[yellow]skipped[/]")
            continue
        rel = max((c.value for c in a.checks if c.name.endswith("rel_l2")), default=float("nan"))
        cos = min((c.value for c in a.checks if c.name.endswith("cosine")), default=float("nan"))
        task = ", ".join(f"{k} {v:.3g}" for k, v in a.task.items() if k in ("map50", "recall", "precision", "abs_rel", "delta1"))
        failed = [c.name for c in a.checks if not c.passed]
        gate = "[green]pass[/]" if not failed else "[bold red]FAIL[/] " + ", ".join(failed)
        table.add_row(a.name, "yes", f"{rel:.2e}", f"{cos:.6f}", task, gate)
    console.print(table)
