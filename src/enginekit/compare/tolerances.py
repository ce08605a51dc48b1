"""Tolerances a user sets (``--tol``, a recipe's ``verification.tolerances``), parsed once.

A limit is ``[precision.][part.]NAME=VALUE``: NAME is a parity statistic (``rel_l2``, ``cosine``,
``max_abs``: per output part too, ``scores.max_abs=0.01``), a family's task metric (``map50``) or
task option (``conf``), or, with the part ``gt``, a loss against labels (``gt.map50_95_drop=0.01``:
``verify --data``); a precision prefix (``fp16.rel_l2``) limits one precision only. Values
are range-checked by the statistics table (``cosine`` in (0, 1], ``recall`` at most 1, ...).
Requests and recipes hold a :class:`Tolerances`; the gates (``compare.comparison.Gates``) take
the family's defaults from it, with the more specific limit winning and, of equal ones, the later.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Optional

from enginekit.compare.metrics import GROUND_TRUTH_LIMITS, GROUND_TRUTH_PART, PARITY_LIMITS, STATISTICS
from enginekit.errors import UsageError
from enginekit.precisions import NAMES as PRECISIONS

GRAMMAR = "[precision.][part.]NAME"
EXAMPLES = "like rel_l2=1e-3, scores.max_abs=0.02 or fp16.map50=0.9"


@dataclass(frozen=True)
class Limit:
    """One tolerance: ``fp16.scores.max_abs=0.01`` is Limit("max_abs", 0.01, "fp16", "scores")."""

    name: str
    value: float
    precision: Optional[str] = None
    part: Optional[str] = None

    @property
    def key(self) -> str:
        return ".".join(t for t in (self.precision, self.part, self.name) if t)

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}"

    def problem(self, names: Optional[Iterable[str]] = None) -> Optional[str]:
        """What is wrong with this limit (None: nothing); ``names``: the task metrics and options
        it may name besides the parity statistics (None: every one the statistics table knows)."""
        if self.precision is not None and self.precision not in PRECISIONS:
            return f"unknown precision {self.precision!r}: choose {', '.join(PRECISIONS)}"
        known = known_names(names)
        if self.part == GROUND_TRUTH_PART or self.name in GROUND_TRUTH_LIMITS:
            if self.part != GROUND_TRUTH_PART:
                return f"a loss against labels is written {GROUND_TRUTH_PART}.{self.name}"
            if self.name not in GROUND_TRUTH_LIMITS:
                return f"unknown limit against labels {self.name!r}: choose {', '.join(GROUND_TRUTH_LIMITS)}"
            return STATISTICS[self.name].limit_problem(self.value)
        if self.part is not None and self.name not in PARITY_LIMITS:
            return f"a part takes a parity limit ({', '.join(PARITY_LIMITS)}), not {self.name!r}"
        if self.name not in known:
            return f"unknown tolerance {self.name!r}: choose {', '.join(known)}"
        stat = STATISTICS.get(self.name)
        if stat is not None:
            return stat.limit_problem(self.value)
        if not math.isfinite(self.value) or self.value <= 0:  # a family's own metric: a positive number
            return f"{self.value:g} is not a positive finite number"
        return None


def known_names(names: Optional[Iterable[str]] = None) -> tuple[str, ...]:
    """Names a tolerance may set: the parity limits, then ``names`` (default: the table's task metrics
    and options)."""
    if names is None:
        names = [n for n, s in STATISTICS.items() if s.kind not in ("parity", "ground_truth")]
    return (*PARITY_LIMITS, *sorted(set(names) - set(PARITY_LIMITS)))


def parse_limit(item: str, names: Optional[Iterable[str]] = None, *, flag: str = "--tol") -> Limit:
    """``"fp16.scores.max_abs=0.01"`` -> Limit; anything wrong is one UsageError naming ``item``."""
    key, sep, text = item.partition("=")
    key = key.strip()
    try:
        if not sep or not key:
            raise ValueError
        value = float(text)
    except ValueError as cause:
        raise UsageError(f"malformed {flag} {item!r}: expected NAME=NUMBER, {EXAMPLES}") from cause
    tokens = key.split(".")
    if len(tokens) > 1 and re.fullmatch(r"(fp|bf|int)\d+", tokens[0]) and tokens[0] not in PRECISIONS:
        raise UsageError(f"{flag} {key}: unknown precision {tokens[0]!r}: choose {', '.join(PRECISIONS)}")
    precision = tokens.pop(0) if len(tokens) > 1 and tokens[0] in PRECISIONS else None
    if len(tokens) > 2 or not all(tokens):
        raise UsageError(f"{flag} {key}: expected {GRAMMAR}")
    limit = Limit(tokens[-1], value, precision, tokens[0] if len(tokens) == 2 else None)
    problem = limit.problem(names)
    if problem:
        raise UsageError(f"{flag} {key}: {problem}")
    return limit


class Tolerances:
    """The limits a user set, in the order given (of two equal ones, the later wins).

    Immutable. (A plain class, not a dataclass: requests copy it as it is, where pydantic would turn
    a dataclass into a dict.)"""

    __slots__ = ("limits",)

    def __init__(self, limits: Iterable[Limit] = ()):
        object.__setattr__(self, "limits", tuple(limits))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Tolerances is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tolerances) and other.limits == self.limits

    def __hash__(self) -> int:
        return hash(self.limits)

    def __repr__(self) -> str:
        return f"Tolerances({self.items()!r})"

    @classmethod
    def parse(cls, items: list[str] | tuple[str, ...], names: Optional[Iterable[str]] = None, *,
              flag: str = "--tol") -> "Tolerances":
        """``["rel_l2=1e-3", "fp16.map50=0.8"]`` -> Tolerances (``names``: as :meth:`Limit.problem`)."""
        names = None if names is None else tuple(names)
        return cls(tuple(parse_limit(item, names, flag=flag) for item in items))

    @classmethod
    def coerce(cls, value: Any, names: Optional[Iterable[str]] = None) -> "Tolerances":
        """None, a Tolerances, ``--tol`` strings or a mapping of their names to values
        (``{"fp16.rel_l2": 0.02}``) -> Tolerances."""
        if value is None:
            return cls()
        if isinstance(value, Tolerances):
            return value
        if isinstance(value, Mapping):
            return cls.parse([f"{key}={number!r}" for key, number in value.items()], names)
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
            return cls.parse(value, names)
        raise UsageError(f"tolerances: expected NAME=NUMBER strings ({EXAMPLES}), not {value!r}")

    def __add__(self, other: "Tolerances") -> "Tolerances":
        return Tolerances(self.limits + Tolerances.coerce(other).limits)

    def __iter__(self) -> Iterator[Limit]:
        return iter(self.limits)

    def __len__(self) -> int:
        return len(self.limits)

    def __bool__(self) -> bool:
        return bool(self.limits)

    def __str__(self) -> str:
        return " ".join(str(limit) for limit in self.limits)

    def items(self) -> list[str]:
        """As ``--tol`` items (``fp16.rel_l2=0.02``): what a command line would repeat."""
        return [str(limit) for limit in self.limits]

    def get(self, precision: str, name: str, default: Any, part: Optional[str] = None) -> Any:
        """The limit on ``name`` for ``precision`` (and output ``part``), else ``default``: the most
        specific wins (precision and part, part, precision, neither), then the later."""
        found: dict[tuple, float] = {(limit.precision, limit.part, limit.name): limit.value for limit in self.limits}
        order = ((precision, part), (None, part)) if part else ()
        for key in (*order, (precision, None), (None, None)):
            if (*key, name) in found:
                return found[(*key, name)]
        return default

    def check(self, family: str, parts: Iterable[str], metrics: Iterable[str], options: Iterable[str]) -> None:
        """Refuse, in one line, a limit a family does not have (a part, a task metric or option)."""
        parts, names = set(parts), set(metrics) | set(options)
        for limit in self.limits:
            ok = (limit.part is None and (limit.name in PARITY_LIMITS or limit.name in names)) or (
                limit.part in parts and limit.name in PARITY_LIMITS) or (
                limit.part == GROUND_TRUTH_PART and limit.name in GROUND_TRUTH_LIMITS)
            if not ok:
                known = ", ".join([*PARITY_LIMITS, *sorted(names)])
                raise UsageError(f"unknown tolerance {limit.key!r} for {family}: use {GRAMMAR} with NAME one of "
                                 f"{known} and part one of {', '.join(sorted(parts))}")
