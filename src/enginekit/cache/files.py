"""File-system helpers of the local cache: flush, touch, remove, measure."""

from __future__ import annotations

import contextlib
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from enginekit.fsutil import fsync_dir as _fsync_dir, fsync_file as _fsync_file
from enginekit.hashing import canonical

def fsync_tree(folder: Path) -> None:
    """Flush every file and folder to disk, so the rename never publishes unwritten data."""
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            _fsync_file(os.path.join(dirpath, name))
        _fsync_dir(Path(dirpath))


def touch(path: Path) -> None:
    """Record a use: the entry folder's mtime is its last-used time (gc evicts by it)."""
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache still serves hits


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_children(folder: Path) -> None:
    if folder.is_dir():
        for name in os.listdir(folder):
            remove(folder / name)


def tree_size(path: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def pid_alive(pid: int) -> bool:
    import psutil  # lazy: a second or so of import, only gc needs it

    return pid > 0 and psutil.pid_exists(pid)


def changed_parts(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """Top-level keys whose values differ (compared as canonical JSON: tuple == list)."""
    missing = object()

    def same(k: str) -> bool:
        a, b = new.get(k, missing), old.get(k, missing)
        if a is missing or b is missing:
            return False
        return canonical(a) == canonical(b)

    return [k for k in new if not same(k)] + [k for k in old if k not in new]


def parse_time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
