"""Entries in use: a run holds a lock on a marker file per entry it was handed, and ``gc``/``purge`` in any
process keep those entries (the kernel drops the locks when the run ends)."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import lock_descriptor

from enginekit.cache.files import remove

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_USE_LOCK = threading.Lock()
_USES: dict[Path, tuple[Path, int]] = {}  # this process's markers: folder -> (marker, locked fd)
_SCOPE = {"depth": 0}


@contextlib.contextmanager
def holding_entries() -> Iterator[None]:
    """Every entry the cache hands out inside this block stays in use until the outermost block
    ends: ``gc`` and ``purge`` (in any process) keep it. The CLI's verbs and ``flows.run`` hold one."""
    with _USE_LOCK:
        _SCOPE["depth"] += 1
    try:
        yield
    finally:
        with _USE_LOCK:
            _SCOPE["depth"] -= 1
            if _SCOPE["depth"] == 0:
                for marker, fd in _USES.values():
                    with contextlib.suppress(OSError):
                        marker.unlink()
                    with contextlib.suppress(OSError):
                        os.close(fd)
                    with contextlib.suppress(OSError):
                        marker.parent.rmdir()
                _USES.clear()


def markers_held(folder: Path) -> bool:
    """Whether any marker in ``folder`` is locked by a live run. Markers whose run ended are
    removed (while locked here, so no other cleaner races on them), then the folder if empty.
    A staged marker (dot name: being locked and renamed) counts as held for a minute."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    held = False
    for name in os.listdir(folder):
        path = folder / name
        if name.startswith("."):
            try:
                age = time.time() - path.lstat().st_mtime
            except FileNotFoundError:
                continue
            if age < 60:
                held = True
            else:
                remove(path)
            continue
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        except OSError:
            continue
        try:
            if not lock_descriptor(fd, blocking=False):
                held = True
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        except OSError:
            held = True  # cannot tell: keep the entry
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        folder.rmdir()
    return held



def mark_in_use(root: Path, kind: str, key: str) -> None:
    """While a run (``holding_entries``) goes on, hold a lock that tells gc and purge this entry is
    in use. Nothing outside a run; a cache that cannot be written is simply not marked."""
    if not _SCOPE["depth"]:
        return
    folder = root / ".inuse" / f"{kind}-{key}"
    with _USE_LOCK:
        if folder in _USES:
            return
        for _ in range(3):  # gc may remove an empty folder between mkdir and open
            staged = folder / f".{os.getpid()}-{secrets.token_hex(4)}"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                fd = os.open(staged, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
            except FileNotFoundError:
                continue
            except OSError:
                return
            try:
                lock_descriptor(fd, blocking=False)
                final = folder / staged.name[1:]
                os.rename(staged, final)  # only locked markers carry a final name
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):
                    staged.unlink()
                continue
            _USES[folder] = (final, fd)
            return


def in_use(root: Path, kind: str, key: str) -> bool:
    """Whether a live run holds a marker of this entry; markers of ended runs are removed."""
    return markers_held(root / ".inuse" / f"{kind}-{key}")


def clean_inuse(root: Path) -> None:
    """Remove the markers (and folders) of runs that ended."""
    folder = root / ".inuse"
    if folder.is_symlink() or not folder.is_dir():
        return
    for name in os.listdir(folder):
        markers_held(folder / name)
