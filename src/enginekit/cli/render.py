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

def _width(stream) -> int | None:
    """A terminal's own width, else $COLUMNS where a CI log sets it, else 120 (rich would take 80)."""
    import os

    try:
        tty = stream is not None and stream.isatty()
    except (ValueError, OSError):  # a closed stream
        tty = False
    return None if tty or os.environ.get("COLUMNS", "").strip().isdigit() else 120


console = Console(stderr=True, highlight=False, width=_width(sys.stderr))
out = Console(highlight=False, width=_width(sys.stdout))  # stdout, for results a script may capture

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


#: seconds between "still running" lines in a log (stderr not a terminal); ENGINEKIT_PROGRESS_SECONDS sets it
HEARTBEAT_SECONDS = 20.0


class RichReporter(reporting.Reporter):
    """Today's look: a spinner while a stage runs, then ``  ✓ label  1.23s  cached``.

    In a log (stderr is no terminal, so no spinner moves), a stage or count that runs long says so
    every ``HEARTBEAT_SECONDS``: ``  still running: export (1m40s)``, with the count of a progress
    (``calibrate 12/64``), so a CI log never sits silent through a 3-minute repair.
    """

    def __init__(self, target: Console | None = None, heartbeat: float | None = None):
        import threading

        self.console = target or console
        self._spinners: list = []
        self._nested: list[int] = []  # per open stage: how many stages it held
        self._bars: dict[int, tuple] = {}
        self._active: list = []  # stages and progresses running now, outermost first
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self.heartbeat = heartbeat if heartbeat is not None else _heartbeat_seconds()
        self._log = not self.console.is_terminal

    # -- the heartbeat of a log
    def _begin(self, item) -> None:
        import threading
        import time

        if not self._log or self.heartbeat <= 0:
            return
        with self._lock:
            self._active.append((item, time.monotonic()))
            if self._thread is None or not self._thread.is_alive():
                self._wake.clear()
                self._thread = threading.Thread(target=self._beat, name="enginekit-heartbeat", daemon=True)
                self._thread.start()

    def _end(self, item) -> None:
        with self._lock:
            self._active = [(i, t) for i, t in self._active if i is not item]
            if not self._active:
                self._wake.set()

    def _beat(self) -> None:
        import time

        while not self._wake.wait(self.heartbeat):
            with self._lock:
                if not self._active:
                    return
                stages = [(i, t) for i, t in self._active if isinstance(i, reporting.Stage)]
                counts = [i for i, _ in self._active if isinstance(i, reporting.Progress)]
                item, started = (stages or self._active)[-1]
            label = item.label
            if counts:
                c = counts[-1]
                count = f"{c.done}/{c.total if c.total is not None else '?'}"
                # a count running alone (no stage around it) is the item: its label once, then the count
                label += f" {count}" if c is item else f", {c.label} {count}"
            self.console.print(f"  still running: {label} ({_elapsed(time.monotonic() - started)})",
                               markup=False, highlight=False)

    def stage_started(self, stage: reporting.Stage) -> None:
        status = self.console.status(f"[bold]{stage.label}[/]…", spinner="dots")
        status.start()
        if self._nested:
            self._nested[-1] += 1  # the stage running now holds this one: its time includes this one's
        self._spinners.append(status)
        self._nested.append(0)
        self._begin(stage)

    def stage_done(self, stage: reporting.Stage) -> None:
        self._end(stage)
        depth = max(len(self._spinners) - 1, 0)  # stages still open around this one
        if self._spinners:
            self._spinners.pop().stop()
        held = self._nested.pop() if self._nested else 0
        if not stage.failed:
            tag = STATUS_TAGS.get(stage.status, stage.status)
            detail = f"  {stage.detail}" if stage.detail else ""
            total = " in all" if held else ""  # its own line comes after those of the stages it held
            label = f"{'  ' * depth}{stage.label}"
            mark = "[red]✗[/]" if stage.status == "fail" else "[green]✓[/]"  # a step that failed shows no tick
            self.console.print(f"  {mark} {label:<28} {stage.seconds:6.2f}s{total}  {tag}{detail}")

    def note(self, text: str, level: int = 0) -> None:
        self.console.print("  " * (level + 1) + text, markup=False)

    def library(self, text: str) -> None:
        import os

        if os.environ.get("ENGINEKIT_VERBOSE", "").strip().lower() in ("1", "true", "yes", "on"):
            self.console.print("  library: " + " ".join(text.split()), markup=False, highlight=False, style="dim")

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
        self._begin(progress)

    def progress_advanced(self, progress: reporting.Progress) -> None:
        bar, task = self._bars[id(progress)]
        bar.update(task, completed=progress.done, total=progress.total, detail=progress.detail)

    def progress_done(self, progress: reporting.Progress) -> None:
        self._end(progress)
        bar, _ = self._bars.pop(id(progress))
        bar.stop()
        if self._log and progress.done:  # the bar leaves no line in a log: its count does
            self.console.print(f"    {progress.label} {progress.done}/{progress.total}", markup=False, highlight=False)


def _heartbeat_seconds() -> float:
    import os

    try:
        return float(os.environ.get("ENGINEKIT_PROGRESS_SECONDS", HEARTBEAT_SECONDS))
    except ValueError:
        return HEARTBEAT_SECONDS


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def parity_table(results) -> None:
    """One row per artifact x output part: worst errors over all inputs, against that part's limits;
    failed checks and task metrics below the table, as lines that wrap (80-column logs). A part whose
    reference is the same for every input could not fail: its gate reads n/a, never pass."""
    from enginekit.compare.comparison import of_part

    table = Table(title="parity vs FP32 PyTorch (ONNX Runtime CPU)", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False, collapse_padding=True)
    for col in ("graph", "part", "n", "max abs", "rel L2", "cosine", "limit", "gate"):
        figure = col not in ("graph", "part", "gate")
        table.add_column(col, justify="right" if figure else "left", no_wrap=figure or col == "gate",
                         min_width=8 if col in ("max abs", "rel L2", "cosine") else None, overflow="fold")
    lines: list[str] = []
    for r in results:
        limits = r.limits() if hasattr(r, "limits") else {}
        for name, w in r.worst().items():
            tol = limits.get(name, r.tolerance)
            failed = [f for f in r.failures() if of_part(f, name)]
            constant = name in getattr(getattr(r, "comparison", None), "constant", {})
            gate = "[bold red]FAIL[/]" if failed else "[yellow]n/a[/]" if constant else "[green]pass[/]"
            table.add_row(escape(f"{r.artifact} {r.precision}"), escape(name), str(len(r.cases)),
                          _figure(w.get("max_abs"), ".2e"), _figure(w.get("rel_l2"), ".2e"),
                          _figure(w.get("cosine"), ".6f"), _figure(tol.rel_l2, ".0e"), gate)
        task = _task_text(getattr(r, "task", {}))
        notes = getattr(r.comparison, "notes", []) if getattr(r, "comparison", None) else []
        if task or notes:
            lines.append(f"  {escape(r.artifact)} {r.precision} task: {escape(task or '-')}"
                         + "".join(f" [yellow]({escape(n)})[/]" for n in notes))
        lines += [f"  {escape(r.artifact)} {r.precision} [bold red]FAIL[/] {escape(f)}" for f in r.failures()]
    console.print(table)
    for line in lines:
        console.print(line, highlight=False)


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
    """One row per artifact and output part: what ran, the worst figures, and the gate; then, below
    the table, each artifact's task metrics, failed checks and reasons as lines that wrap.

    The table holds only short, fixed-width cells, so it fits an 80-column CI log without a
    truncated column; long text (a failure, why an engine did not run) is never squeezed into a cell.
    A part whose reference is the same for every input could not fail: its gate reads n/a, never pass.
    """
    from enginekit.compare.comparison import of_part

    refs = (f"  (references {report.references_key[:10]}: "
            f"{'stored' if report.references_status in ('hit', 'pulled') else 'computed'})" if report.references_key
            else "  (no references computed)")
    table = Table(title=f"verify {report.subject} {report.precision}{refs}",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  collapse_padding=True)
    for col in ("artifact", "ran", "part", "max abs", "rel L2", "cosine", "gate"):
        figure = col in ("max abs", "rel L2", "cosine")
        table.add_column(col, justify="right" if figure else "left", no_wrap=figure or col in ("ran", "gate"),
                         min_width=8 if figure else None, overflow="fold")
    lines: list[str] = []
    for a in report.artifacts:
        if not a.ran:
            gate = "[bold red]FAIL[/]" if not a.passed else "[yellow]skip[/]"  # e.g. a corrupt cache entry
            table.add_row(escape(a.name), "[yellow]no[/]", "", "", "", "", gate)
            lines.append(f"  {escape(a.name)}: [yellow]not run[/]: {escape(a.reason)}")
            continue
        rows = list(a.parts.items()) or [("", {"worst": {}})]
        for i, (part, info) in enumerate(rows):
            w = info["worst"]
            failed = [c for c in a.checks if not c.passed and of_part(c.name, part)]
            gate = "[bold red]FAIL[/]" if failed else "[yellow]n/a[/]" if "constant" in info else "[green]pass[/]"
            table.add_row(escape(a.name) if i == 0 else "", "yes" if i == 0 else "", escape(part),
                          _figure(w.get("max_abs"), ".2e"), _figure(w.get("rel_l2"), ".2e"),
                          _figure(w.get("cosine"), ".6f"), gate)
        task = _task_text(a.task)
        if task:
            lines.append(f"  {escape(a.name)} task: {escape(task)}")
        for c in a.checks:
            if not c.passed:
                lines.append(f"  {escape(a.name)} [bold red]FAIL[/] {escape(c.name)}" + (
                    "" if c.condition else f" = {c.value:.4g} (limit {c.op} {c.limit:g})"))
    console.print(table)
    for line in lines:
        console.print(line, highlight=False)


def _figure(value, fmt: str) -> str:
    """A figure of the table; "-" where there is none (no NaN in what a person reads)."""
    import math

    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


def ladder_table(outcome) -> None:
    """verify --data: per precision and artifact, the headline figure against the labels and its drop against the
    FP32 PyTorch model (the gate on it), the file's size, and bench's latency where bench ran it here."""
    rows = outcome.ladder
    info = next((r.ground_truth for r in outcome.reports if r.ground_truth), {})
    metric = rows[0]["metric"] if rows else "map50_95"
    title = (f"against the labels of {info.get('data', '?')} ({info.get('split', 'val')}: {info.get('images', '?')} "
             f"images, {info.get('instances', '?')} {info.get('unit', 'instances')}, at {'x'.join(map(str, info.get('network_hw', [])))})")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    latency = any(r.get("latency_ms") for r in rows)
    label = {"miou": "mIoU"}.get(metric) or metric.replace("_", " ").replace("map50 95", "mAP50-95").replace("map", "mAP")
    for col in ("precision", "artifact", "letterbox", label,
                "drop", "gate", "size MB", *(["p50 ms (bench)"] if latency else [])):
        table.add_column(col, no_wrap=True)
    for r in rows:
        drop = "" if r["artifact"] == "PyTorch" else f"{r['drop']:+.4f}" if r["drop"] is not None else ""
        if drop and r.get("interval"):  # the drop's 95% interval (a paired bootstrap over the images)
            drop += f" [{r['interval'][0]:+.3f}, {r['interval'][1]:+.3f}]"
        other = [f for f in r.get("failing", []) if "labels" not in f]  # a check of the artifact besides the labels'
        if r["passed"] is None:
            gate = "reference" if r["artifact"] == "PyTorch" else ""
        elif not r["passed"] and r.get("undecided"):
            gate = f"[bold red]FAIL[/] (not enough evidence: the interval straddles {r['limit']:g})"
        elif not r["passed"]:
            gate = f"[bold red]FAIL[/] (> {r['limit']:g})"
        elif other or r.get("verdict") is False:  # the labels' drop is within its limit, the artifact is not
            gate = f"[bold red]FAIL[/] ({escape(other[0] if other else 'another check')})"
        else:
            gate = f"[green]pass[/] (<= {r['limit']:g})"
        cells = [r["precision"], r["artifact"], r.get("letterbox") or "", f"{r['value']:.4f}", drop, gate,
                 f"{r['size_mb']:.1f}" if r["size_mb"] else ""]
        if latency:
            lat = r.get("latency_ms")
            cells.append(f"{lat['p50_ms']:.2f} ({lat['backend']})" if lat else "")
        table.add_row(*cells)
    console.print(table)
    from enginekit.verification.ladder import letterbox_legend

    legend = letterbox_legend(rows)
    if legend:
        console.print(f"  {escape(legend)}")
    for note in info.get("notes", []):
        console.print(f"  [yellow]note:[/] {escape(note)}")
