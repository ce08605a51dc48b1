"""Terminal output: the reporting interface drawn with rich on stderr, and tables.

stdout is kept for results a script captures (an engine or file path, JSON); everything else
(spinners, stage lines, notes, warnings, tables about checks) goes to stderr.
"""

from __future__ import annotations

import sys

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from enginekit import reporting

# rich falls back to 80 columns when not on a terminal (CI logs): tables need more.
console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 120)  # stdout, for results a script may capture

STATUS_TAGS = {
    "hit": "[green]cached[/]",
    "pulled": "[green]pulled from the store[/]",
    "miss": "[yellow]built[/]",
    "forced": "[yellow]rebuilt (--force)[/]",
    "corrupt": "[yellow]rebuilt: the cached entry was corrupt[/]",
    "pass": "[green]pass[/]",
    "fail": "[red]FAIL[/]",
    "not-checked": "[yellow]not checked[/]",
}


def emit(text: str) -> None:
    """A result on stdout (an engine or file path), never wrapped: scripts capture it."""
    print(text, flush=True)


class RichReporter(reporting.Reporter):
    """Today's look: a spinner while a stage runs, then ``  ✓ label  1.23s  cached``."""

    def __init__(self, target: Console | None = None):
        self.console = target or console
        self._spinners: list = []
        self._bars: dict[int, tuple] = {}

    def stage_started(self, stage: reporting.Stage) -> None:
        status = self.console.status(f"[bold]{stage.label}[/]…", spinner="dots")
        status.start()
        self._spinners.append(status)

    def stage_done(self, stage: reporting.Stage) -> None:
        if self._spinners:
            self._spinners.pop().stop()
        if not stage.failed:
            tag = STATUS_TAGS.get(stage.status, stage.status)
            detail = f"  {stage.detail}" if stage.detail else ""
            self.console.print(f"  [green]✓[/] {stage.label:<28} {stage.seconds:6.2f}s  {tag}{detail}")

    def note(self, text: str, level: int = 0) -> None:
        self.console.print("  " * (level + 1) + text, markup=False)

    def warning(self, text: str) -> None:
        from rich.text import Text

        line = Text("warning:", style="yellow")
        line.append(" " + " ".join(text.split()))
        self.console.print(line, soft_wrap=True, highlight=False)  # one line, however long: logs grep it

    def progress_started(self, progress: reporting.Progress) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("  [bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=self.console,
                       transient=True)
        task = bar.add_task(progress.label, total=progress.total, detail=progress.detail)
        bar.start()
        self._bars[id(progress)] = (bar, task)

    def progress_advanced(self, progress: reporting.Progress) -> None:
        bar, task = self._bars[id(progress)]
        bar.update(task, completed=progress.done, detail=progress.detail)

    def progress_done(self, progress: reporting.Progress) -> None:
        bar, _ = self._bars.pop(id(progress))
        bar.stop()


def parity_table(results) -> None:
    """One row per artifact x output part: worst errors over all inputs, against that part's limits."""
    table = Table(title="parity vs FP32 PyTorch (ONNX Runtime CPU)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("graph", "part", "n", "max abs", "rel L2", "cosine", "limit", "gate"):
        table.add_column(col, justify="left" if col in ("graph", "part", "gate") else "right", no_wrap=True)
    for r in results:
        limits = r.limits() if hasattr(r, "limits") else {}
        for name, w in r.worst().items():
            tol = limits.get(name, r.tolerance)
            failed = [f.split(" = ")[0] for f in r.failures() if f.startswith(f"parity {name} ")]
            gate = "[bold red]FAIL[/] " + ", ".join(failed) if failed else "[green]pass[/]"
            table.add_row(f"{r.artifact} {r.precision}", name, str(len(r.cases)), f"{w['max_abs']:.2e}",
                          f"{w['rel_l2']:.2e}", f"{w['cosine']:.6f}", f"{tol.rel_l2:.0e}", gate)
        task_failed = [f for f in r.failures() if f.startswith("task")]
        if task_failed:
            table.add_row(f"{r.artifact} {r.precision}", "task", "", "", "", "", "", "[bold red]FAIL[/] " + "; ".join(task_failed))
    console.print(table)
    for r in results:
        task = _task_text(getattr(r, "task", {}))
        notes = getattr(r.comparison, "notes", []) if getattr(r, "comparison", None) else []
        if task or notes:
            console.print(f"  {r.artifact} {r.precision} task: {task or '-'}" + "".join(f" [yellow]({n})[/]" for n in notes))


def _task_text(task: dict) -> str:
    if task.get("compared", 1) <= 0:
        return ""  # the comparison's note (or failed check) says why
    names = (("recall", "recall"), ("precision", "precision"), ("map50", "mAP50"), ("map50_95", "mAP50-95"),
             ("mask_map50", "mask mAP50"), ("pose_map50", "pose mAP50"), ("top1_agreement", "top-1 agreement"),
             ("top5_overlap", "top-5 overlap"), ("miou", "mIoU"), ("pixel_accuracy", "pixel accuracy"),
             ("score_shift_max", "score shift max"), ("abs_rel", "AbsRel"), ("delta1", "delta1"))
    text = ", ".join(f"{label} {task[k]:.3g}" for k, label in names if k in task)
    if "conf" in task:
        text = f"@conf {task['conf']:g} ({int(task.get('reference_detections', 0))} ref. det.): " + text
    return text


def verify_table(report) -> None:
    """One row per artifact: what ran, the worst figures, and the gate."""
    table = Table(title=f"verify {report.subject} {report.precision}  (references {report.references_key[:10]}: "
                        f"{'stored' if report.references_status in ('hit', 'pulled') else 'computed'})",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("artifact", "ran", "part", "max abs", "rel L2", "cosine", "task", "gate"):
        table.add_column(col, no_wrap=col not in ("task", "gate"), overflow="fold")
    for a in report.artifacts:
        if not a.ran:
            gate = "[bold red]FAIL[/]" if not a.passed else "[yellow]skipped[/]"  # e.g. a corrupt cache entry
            table.add_row(a.name, "[yellow]no[/]", "", "", "", "", escape(a.reason), gate)
            continue
        rows = list(a.parts.items()) or [("", {"worst": {}})]
        task = _task_text(a.task)
        task_failed = [c.name for c in a.checks if not c.passed and not c.name.startswith("parity ")]
        for i, (part, info) in enumerate(rows):
            w = info["worst"]
            failed = [c.name for c in a.checks if not c.passed and c.name.startswith(f"parity {part} ")]
            failed += task_failed if i == len(rows) - 1 else []
            gate = "[green]pass[/]" if not failed else "[bold red]FAIL[/] " + ", ".join(failed)
            table.add_row(a.name if i == 0 else "", "yes" if i == 0 else "", part, f"{w.get('max_abs', float('nan')):.2e}",
                          f"{w.get('rel_l2', float('nan')):.2e}", f"{w.get('cosine', float('nan')):.6f}",
                          task if i == 0 else "", gate)
    console.print(table)
