"""The one interface the library reports through: stages, notes, warnings, progress, results.

The library never prints. Deep code reports to the *current* reporter (a context variable),
so nothing threads a parameter through every call::

    from enginekit import reporting

    with reporting.stage("export") as s:      # started ... done, timed
        ...
        s.status = "miss"                     # hit | miss | forced | corrupt | pass | fail | not-checked
        s.detail = "3.2 MiB"
    reporting.note("calibration: 8 inputs", level=1)
    reporting.warning("the graph failed its parity check")
    with reporting.progress("timing", total=40) as p:
        p.advance()

Who listens: the CLI installs a renderer (``enginekit.cli.render.RichReporter``: spinners and
one line per stage on stderr); the Python API collects events (``Collector``) and returns them
with its result; ``Reporter()`` itself drops everything (the default when nobody listens).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterator

# Stage statuses a renderer knows how to draw; any other text is shown as is. A Collector
# records a stage that raised as "error".
STATUSES = ("hit", "pulled", "miss", "forced", "corrupt", "pass", "fail", "not-checked")


@dataclass
class Stage:
    """A running (then finished) stage: set ``status`` and ``detail`` before it ends."""

    label: str
    status: str = ""
    detail: str = ""
    seconds: float = 0.0
    failed: bool = False  # it ended with an exception


@dataclass
class Progress:
    """Counted work (calibration batches, benchmark runs): ``advance()`` as each one is done."""

    label: str
    total: int
    done: int = 0
    detail: str = ""  # shown beside the bar (a rate such as "58.1 FPS")
    _reporter: "Reporter | None" = field(default=None, repr=False)

    def advance(self, n: int = 1, detail: str | None = None) -> None:
        self.done += n
        if detail is not None:
            self.detail = detail
        if self._reporter is not None:
            self._reporter.progress_advanced(self)


@dataclass(frozen=True)
class Event:
    """What a ``Collector`` keeps: kind is stage | note | warning | progress | result."""

    kind: str
    label: str
    status: str = ""
    detail: str = ""
    seconds: float | None = None
    level: int = 0
    value: Any = None

    def to_json(self) -> dict:
        out = {"kind": self.kind, "label": self.label}
        for name in ("status", "detail", "seconds", "value"):
            value = getattr(self, name)
            if value not in ("", None):
                out[name] = value
        return out


class Reporter:
    """The interface; this base drops everything (the null reporter)."""

    def stage_started(self, stage: Stage) -> None:
        pass

    def stage_done(self, stage: Stage) -> None:
        pass

    def note(self, text: str, level: int = 0) -> None:
        pass

    def warning(self, text: str) -> None:
        pass

    def progress_started(self, progress: Progress) -> None:
        pass

    def progress_advanced(self, progress: Progress) -> None:
        pass

    def progress_done(self, progress: Progress) -> None:
        pass

    def result(self, name: str, value: Any) -> None:
        pass

    def library(self, text: str) -> None:
        """A warning a third-party library logged (``library_logs``): a renderer shows it only when asked to."""


NULL = Reporter()


class Collector(Reporter):
    """Keeps every event (the Python API returns them); ``forward`` also passes each one on."""

    def __init__(self, forward: Reporter | None = None):
        self.events: list[Event] = []
        self.forward = forward if forward is not None else NULL

    def stage_started(self, stage: Stage) -> None:
        self.forward.stage_started(stage)

    def stage_done(self, stage: Stage) -> None:
        status = "error" if stage.failed else stage.status
        self.events.append(Event("stage", stage.label, status, stage.detail, round(stage.seconds, 3)))
        self.forward.stage_done(stage)

    def note(self, text: str, level: int = 0) -> None:
        self.events.append(Event("note", text, level=level))
        self.forward.note(text, level)

    def warning(self, text: str) -> None:
        self.events.append(Event("warning", text))
        self.forward.warning(text)

    def progress_started(self, progress: Progress) -> None:
        self.forward.progress_started(progress)

    def progress_advanced(self, progress: Progress) -> None:
        self.forward.progress_advanced(progress)

    def progress_done(self, progress: Progress) -> None:
        self.events.append(Event("progress", progress.label, detail=f"{progress.done}/{progress.total}"))
        self.forward.progress_done(progress)

    def result(self, name: str, value: Any) -> None:
        self.events.append(Event("result", name, value=value))
        self.forward.result(name, value)

    def library(self, text: str) -> None:
        self.events.append(Event("library", text))
        self.forward.library(text)

    # -- reading -------------------------------------------------------------------------
    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    @property
    def warnings(self) -> list[str]:
        return [e.label for e in self.of("warning")]

    @property
    def results(self) -> dict[str, Any]:
        return {e.label: e.value for e in self.of("result")}


_current: ContextVar[Reporter] = ContextVar("enginekit_reporter", default=NULL)


def current() -> Reporter:
    return _current.get()


@contextmanager
def using(reporter: Reporter) -> Iterator[Reporter]:
    """Report to ``reporter`` inside the block (and in everything it calls)."""
    token = _current.set(reporter)
    try:
        yield reporter
    finally:
        _current.reset(token)


@contextmanager
def collecting(quiet: bool = False) -> Iterator[Collector]:
    """What a Python API call does: collect its events, and unless ``quiet`` pass them on to
    whoever listens already (the CLI's renderer, an outer API call)."""
    with using(Collector(forward=None if quiet else current())) as collector:
        yield collector  # type: ignore[misc]


# -- what the library calls ------------------------------------------------------------------


@contextmanager
def stage(label: str) -> Iterator[Stage]:
    """A timed stage; the reporter hears of it when it starts and when it ends."""
    reporter = current()
    s = Stage(label)
    start = time.perf_counter()
    reporter.stage_started(s)
    try:
        yield s
    except BaseException:
        s.failed = True
        raise
    finally:
        s.seconds = time.perf_counter() - start
        reporter.stage_done(s)


def note(text: str, level: int = 0) -> None:
    """A line of information (``level`` 1: about the stage just reported)."""
    current().note(text, level)


def warning(text: str) -> None:
    current().warning(text)


def result(name: str, value: Any) -> None:
    """A result a renderer may show or serialize (``--json``)."""
    current().result(name, value)


def library(text: str) -> None:
    """What a third-party library logged (its warnings), routed here rather than printed raw."""
    current().library(text)


@contextmanager
def library_logs() -> Iterator[None]:
    """Within the block, warnings that libraries log through Python's logging (ModelOpt's root-logger ``1 ops are
    not supported in 'float16'``, and any other library's that reach the root logger) go to the current reporter's
    ``library``, not raw to the terminal."""
    import logging

    class Routed(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                library(f"{record.name}: {record.getMessage()}")
            except Exception:  # noqa: BLE001 - a log line must never break a run
                pass

    root = logging.getLogger()
    handler = Routed(logging.WARNING)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


@contextmanager
def progress(label: str, total: int) -> Iterator[Progress]:
    reporter = current()
    p = Progress(label, total, _reporter=reporter)
    reporter.progress_started(p)
    try:
        yield p
    finally:
        reporter.progress_done(p)
