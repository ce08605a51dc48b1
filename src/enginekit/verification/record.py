"""An artifact's record: every check a graph of this content has had, and its one verdict, their conjunction.

Each judgement is kept in the cache by what it judged (kind ``parity``: export's, build's and a repair's parity
verdicts; kind ``verdict``: verify's, against the PyTorch reference or against labels), each keyed by the graph's
content, its evidence (the images or labels by digest) and its gates. The record of a graph is all of them: its
verdict fails where any check failed, so a later pass on other evidence never erases an earlier failure; it passes
only where some check passed and none failed. A judgement that decided nothing (each of its failed checks "not
enough evidence": an interval that straddles its limit) fails its own run but is no failure of the graph: more
evidence decides, and the record's verdict is what the decided checks say. ``verify --recheck`` sets the earlier checks aside (removed from the
cache, and said) and judges from scratch. ``build``, ``verify``, ``deploy``, ``predict``, ``load``, ``cache ls``
and ``cache push`` all read this one record, and say the failed check it holds in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from enginekit.compare.intervals import UNDECIDED

#: where a kind's check was made, when its key does not say
_AT = {"parity": "export", "verdict": "verify"}


# UNDECIDED: what a check that decided nothing says (its interval straddles the limit); a judgement whose every
# failed check says it is not a failure of the graph: more evidence decides, and a later decided check counts


@dataclass(frozen=True)
class PastCheck:
    """One stored judgement of a graph: which entry, made where, at which precision, passed or not, what failed and on
    which evidence."""

    kind: str
    key: str
    at: str
    precision: str | None
    passed: bool | None
    failures: tuple[str, ...] = ()
    evidence: str = ""

    def line(self) -> str:
        """"build parity on 2 photographs: task recall = 0.8 (limit >= 0.95) [parity 1a2b3c4d5e]"."""
        what = self.failures[0] if self.failures else ("failed" if self.passed is False else "passed")
        on = f" on {self.evidence}" if self.evidence else ""
        return f"{self.at}{on}: {what} [{self.kind} {self.key[:10]}]"


@dataclass
class Record:
    """The checks of one graph (by its sha256), newest last where the cache says when."""

    graph: str
    checks: list[PastCheck] = field(default_factory=list)

    @property
    def failed(self) -> list[PastCheck]:
        return [c for c in self.checks if c.passed is False]

    @property
    def verdict(self) -> str:
        """"fail" where any check failed; "pass" where one passed and none failed; "unchecked" where none judged it."""
        if self.failed:
            return "fail"
        return "pass" if any(c.passed for c in self.checks) else "unchecked"

    @property
    def passed(self) -> bool | None:
        return {"fail": False, "pass": True}.get(self.verdict)

    def failure_line(self) -> str:
        """The failed check it holds, in one phrase (and how many more), "" where none failed."""
        failed = self.failed
        if not failed:
            return ""
        more = f"; and {len(failed) - 1} more failed check{'s' if len(failed) > 2 else ''}" if len(failed) > 1 else ""
        return failed[0].line() + more

    def summary(self) -> str:
        """Every check behind the verdict, one phrase each ("PASS build parity ...; FAIL verify --data ...")."""
        return "; ".join(("FAIL " if c.passed is False else "PASS " if c.passed else
                          "UNDECIDED " if c.failures else "n/a ") + c.line()
                         for c in self.checks)


def _evidence(kind: str, parts: dict) -> str:
    inputs = parts.get("inputs") or {}
    if kind == "parity":
        if isinstance(inputs, dict) and inputs.get("judged_on"):
            return str(inputs["judged_on"])
        photos = inputs.get("photos") if isinstance(inputs, dict) else None
        return f"{len(photos)} photograph(s)" if isinstance(photos, list) else ""
    if parts.get("labels"):
        return f"labels {str(parts['labels'])[:10]}"
    references = parts.get("references")
    return f"references {str(references)[:10]}" if references else ""


def _failures(kind: str, manifest: dict) -> tuple[str, ...]:
    """The failed checks a stored judgement lists, as text."""
    if kind == "parity":
        result = manifest.get("result") or {}
        checks = result.get("checks") or (result.get("comparison") or {}).get("checks") or []
    else:
        checks = (manifest.get("report") or {}).get("checks") or []
    out = []
    for c in checks:
        if not isinstance(c, dict) or c.get("passed", True):
            continue
        if c.get("condition"):
            out.append(str(c.get("name")))
        else:
            try:
                out.append(f"{c.get('name')} = {float(c.get('value')):.4g} (limit {c.get('op')} {float(c.get('limit')):g})")
            except (TypeError, ValueError):
                out.append(str(c.get("name")))
    return tuple(out)


def _report_passed(report: dict) -> bool | None:
    checks = report.get("checks") or []
    if not report.get("ran", True):
        return None
    return all(isinstance(c, dict) and c.get("passed") for c in checks) if checks else None


def record_of(cache, graph: str, precision: str | None = None) -> Record:
    """The record of the graph whose sha256 is ``graph``: every stored check of it (at ``precision`` where given),
    oldest first."""
    found = []
    for kind in ("parity", "verdict"):
        for entry in cache.entries(kind):
            manifest = entry.manifest
            parts = manifest.get("parts") or {}
            if str(parts.get("graph")) != graph:
                continue
            if precision is not None and parts.get("precision") not in (None, precision):
                continue
            passed = manifest.get("passed") if kind == "parity" else _report_passed(manifest.get("report") or {})
            failures = _failures(kind, manifest)
            if passed is False and failures and all(UNDECIDED in f for f in failures):
                passed = None  # it decided nothing (every failed check "not enough evidence"): no failure to keep
            found.append((str(manifest.get("created", "")), PastCheck(
                kind, entry.key, str(parts.get("at") or _AT[kind]), parts.get("precision"),
                passed if isinstance(passed, bool) or passed is None else None, failures,
                _evidence(kind, parts))))
    found.sort(key=lambda pair: pair[0])
    return Record(graph, [c for _, c in found])


def set_aside(cache, graph: str) -> list[PastCheck]:
    """``--recheck``: remove every stored check of ``graph`` from the cache (they are listed back, for saying so)."""
    record = record_of(cache, graph)
    for check in record.checks:
        cache.forget(check.kind, check.key)
    return record.checks


def engine_record(cache, manifest: dict) -> Record:
    """The record an engine stands on: its source graph's (the last graph of its chain), with the parity its manifest
    recorded when it was built."""
    chain = manifest.get("chain") or []
    graph = next((str(link.get("sha256")) for link in reversed(chain) if link.get("sha256")), "")
    record = record_of(cache, graph) if graph else Record("")
    parity = manifest.get("parity") or {}
    if parity.get("passed") is False and not record.failed:
        failures = tuple(parity.get("failures") or ())
        record.checks.append(PastCheck("engine", str(manifest.get("key", "")), "build", None, False, failures))
    return record
