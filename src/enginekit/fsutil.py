"""Files written so that no reader ever sees half of one.

Every writer in enginekit goes through ``atomic_write``: the data lands in a temporary file
with a unique name in the destination's folder, is flushed to disk, and replaces the
destination in one rename. Two writers of the same path never share a temporary file. The
file gets the mode a plain ``open`` would give it (0666 less the umask), not the temporary
file's 0600.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, else it is removed.

    For writers that want a file name rather than a file object (``onnx.save``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb", **open_kwargs) -> Iterator:
    """``with atomic_write(p, "w", encoding="utf-8") as f: f.write(...)``: all of it or nothing."""
    if mode not in ("w", "wb", "wt"):
        raise ValueError(f"atomic_write writes whole files: mode 'w' or 'wb', not {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, **open_kwargs) as f:
        yield f


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_write(path, "wb") as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    with atomic_write(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return Path(path)


def atomic_copy(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Copy ``src`` to ``dest`` through a temporary file and a rename."""
    with atomic_path(dest) as tmp:
        shutil.copyfile(src, tmp)
    return Path(dest)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc), else by
    setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def is_disk_full(exc: BaseException) -> bool:
    """An error that says the disk (or the quota) is full, raised here or wrapped by a library."""
    import errno

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return True
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def fsync_file(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename durable; some filesystems refuse fsync on folders, which is harmless."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- output paths, checked before work

# Kernel filesystems: nothing there is an ordinary file, and a rename over /dev/null is not a
# write to it.
KERNEL_ROOTS = ("/proc", "/sys", "/dev")


def output_path_problem(path: str | os.PathLike[str], *, folder: bool = False) -> str | None:
    """Why ``path`` cannot receive an output file (with ``folder``, a folder of outputs), or
    None. Creates nothing: callers check every output before any work."""
    p = Path(path).expanduser()
    real = os.path.realpath(p)
    for kernel in KERNEL_ROOTS:
        if real == kernel or real.startswith(kernel + os.sep):
            return f"{p} is under {kernel}, which holds no ordinary files"
    if folder:
        if os.path.lexists(p) and not p.is_dir():
            return f"{p} exists and is not a folder"
    elif p.is_dir():
        return f"{p} is a folder; give a file name"
    elif str(path).endswith(os.sep):
        return f"{path} names a folder; give a file name"
    existing = p if folder else p.parent
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder, so {p} cannot be written"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    if not folder and p.exists() and not os.access(p, os.W_OK):
        return f"{p} is not writable"
    return None


def check_output_path(path: str | os.PathLike[str] | None, what: str, *, folder: bool = False) -> None:
    """Refuse an output path that cannot be written (one-line ``UsageError`` naming ``what``,
    e.g. ``--report``), before any work is done."""
    if path is None:
        return
    problem = output_path_problem(path, folder=folder)
    if problem is not None:
        from enginekit.errors import UsageError

        raise UsageError(f"{what} {path}: {problem}")
