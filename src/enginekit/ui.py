"""Terminal output: rich on stderr (stdout stays for results such as an engine path)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console

import sys

# rich falls back to 80 columns when not on a terminal (CI logs): tables need more.
console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 120)  # stdout, for results a script may capture


class Step:
    """A long step shown as a spinner, then one line with its time and cache status."""

    def __init__(self, label: str):
        self.label = label
        self.status = ""
        self.detail = ""
        self.seconds = 0.0


@contextmanager
def step(label: str, *, quiet: bool = False) -> Iterator[Step]:
    s = Step(label)
    start = time.perf_counter()
    if quiet:
        yield s
        s.seconds = time.perf_counter() - start
        return
    with console.status(f"[bold]{label}[/]…", spinner="dots"):
        yield s
    s.seconds = time.perf_counter() - start
    tag = {"hit": "[green]cached[/]", "miss": "[yellow]built[/]", "rebuilt": "[yellow]rebuilt (--force)[/]",
           "corrupt": "[yellow]rebuilt: the cached entry was corrupt[/]"}.get(s.status, s.status)
    detail = f"  {s.detail}" if s.detail else ""
    console.print(f"  [green]✓[/] {label:<28} {s.seconds:6.2f}s  {tag}{detail}")


def progress_bar(description: str, total: int):
    """A rich progress bar for counted work (calibration batches, benchmark runs)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("  [bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=True)
    task = bar.add_task(description, total=total)
    return bar, task


def emit(text: str) -> None:
    """A result on stdout (an engine or file path), never wrapped: scripts capture it."""
    print(text, flush=True)
