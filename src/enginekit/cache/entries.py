"""What the cache hands out and reports: entries, lookups, explanations, listing rows; and where it lives."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

def default_root() -> Path:
    """``$ENGINEKIT_CACHE``, else ``$XDG_CACHE_HOME/enginekit``, else ``~/.cache/enginekit``."""
    if os.environ.get("ENGINEKIT_CACHE"):
        return Path(os.environ["ENGINEKIT_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "enginekit"
    return Path.home() / ".cache" / "enginekit"


def root_origin() -> str | None:
    """The setting ``default_root()`` took the root from, for messages."""
    if os.environ.get("ENGINEKIT_CACHE"):
        return "ENGINEKIT_CACHE"
    if os.environ.get("XDG_CACHE_HOME"):
        return "XDG_CACHE_HOME"
    return None


# Kernel filesystems: files there are not files, and writing may do anything.
_KERNEL_ROOTS = ("/proc", "/sys", "/dev")


def location_problem(root: str | os.PathLike[str], *, writable: bool = True) -> str | None:
    """Why ``root`` cannot hold the cache (one phrase), or None. Creates nothing.

    A cache location must be a directory (or a path one can be created at) outside the kernel's
    filesystems, and, to build or remove entries, writable.
    """
    path = Path(root).expanduser()
    real = os.path.realpath(path)
    for kernel in _KERNEL_ROOTS:
        if real == kernel or real.startswith(kernel + os.sep):
            return f"{path} is under {kernel}, which holds no ordinary files"
    if os.path.lexists(path) and not path.is_dir():
        return f"{path} exists and is not a directory"
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory, so {path} cannot be created"
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        what = "writable" if existing == path else f"writable, so {path} cannot be created"
        return f"{existing} is not {what}"
    return None




@dataclass
class Entry:
    """One complete cache entry: a folder of files described by its manifest."""

    kind: str
    key: str
    path: Path
    manifest: dict[str, Any]

    def file(self, name: str) -> Path:
        """Path of one of the entry's files, e.g. ``entry.file("engine.plan")``."""
        return self.path / name

    @property
    def subject(self) -> str | None:
        return self.manifest.get("subject")


@dataclass
class LookupResult:
    """What ``Cache.lookup`` found: status "hit" or "pulled" (from the store; with entry), "miss",
    or "corrupt" (reason)."""

    status: str
    entry: Entry | None = None
    reason: str | None = None

    @property
    def hit(self) -> bool:
        return self.status in ("hit", "pulled")


@dataclass
class Explanation:
    """Why a key hits or misses: the closest earlier entry and the parts that changed."""

    status: str  # "hit" or "miss"
    key: str
    subject: str | None = None
    closest_key: str | None = None
    changed: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.status == "hit":
            return "hit"
        if self.closest_key is None:
            what = "this subject" if self.subject is not None else "this kind"
            return f"miss: no earlier entry for {what}"
        return f"miss: differs from entry {self.closest_key[:10]} in: {', '.join(self.changed)}"


@dataclass
class EntryInfo:
    """One row of ``Cache.ls``."""

    kind: str
    key: str
    subject: str | None
    size: int
    created: datetime | None
    last_used: datetime
    valid: bool
    reason: str | None = None
    verified: bool = False  # every file's sha256 checked (else sizes only)
    parity: bool | None = None  # engines: the parity verdict their manifest records

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "key": self.key, "subject": self.subject, "size_bytes": self.size,
            "created": self.created.isoformat(timespec="seconds") if self.created else None,
            "last_used": self.last_used.isoformat(timespec="seconds"), "valid": self.valid, "reason": self.reason,
            "verified": self.verified,
        }
