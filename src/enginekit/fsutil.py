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
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from enginekit.errors import UsageError


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
    elif special_file_kind(p) is not None:  # a write goes to a temporary file renamed over it: it would be replaced
        return f"{p} is {special_file_kind(p)}; enginekit writes regular files (whole, by a rename over the name)"
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
        raise UsageError(f"{what} {path}: {problem}")


# --------------------------------------------------------------------------- input paths, checked before a read

_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_file_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a folder (a FIFO, a device,
    a socket), else None. Checked with ``stat``, never by opening it: a read of a FIFO nobody writes
    to blocks forever, and a device may never end."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None  # missing or unreadable: the caller's own check says which
    for test, kind in _SPECIAL:
        if test(mode):
            return kind
    return None


def refuse_special_file(path: str | os.PathLike[str], what: str) -> None:
    """A one-line ``UsageError`` for an input that is a FIFO, a device or a socket (``what``:
    how the user named it, e.g. "weights" or "ONNX file"); regular files and folders pass."""
    kind = special_file_kind(path)
    if kind is not None:
        raise UsageError(f"{what} {path} is {kind}, not a regular file: enginekit reads only regular files "
                         "(a pipe or device could block the read forever)")


class NotRegular(OSError):
    """``open_regular`` met a FIFO, a device, a socket or a file over its format's size (an ``OSError``, so a
    caller's handling of unreadable files covers it)."""

    def __init__(self, path, problem: str):
        import errno

        super().__init__(errno.EINVAL, f"it is {problem}", str(path))

    def __str__(self) -> str:
        return f"{self.filename} {self.strerror.removeprefix('it ')}"


def open_regular(path: str | os.PathLike[str], *, limit: int | None = None, what: str | None = None):
    """``open(path, "rb")`` for a regular file only: the one way enginekit opens a file it reads itself (a file
    a library opens by its path gets ``refuse_special_file`` first).

    Opened without blocking (opening a FIFO nobody writes to blocks ``open`` itself), then checked on the open
    descriptor, so nothing can be swapped in between: a FIFO, device or socket, or (``limit``) a file larger
    than its format may be, raises ``NotRegular``; with ``what`` (how the user named it: "--data", "calibration
    cache") a one-line ``UsageError`` instead. A missing file or a folder raises as ``open`` does."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        problem = None
        if not stat.S_ISREG(st.st_mode):
            kind = next((kind for test, kind in _SPECIAL if test(st.st_mode)), "a special file")
            problem = f"{kind}, not a regular file (a pipe or device could block the read forever)"
        elif limit is not None and st.st_size > limit:
            problem = f"{st.st_size} bytes, more than the {limit} such a file may have"
        if problem is not None:
            if what is not None:
                from enginekit.errors import UsageError

                raise UsageError(f"{what} {path} is {problem}")
            raise NotRegular(path, problem)
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], *, limit: int | None = None, what: str | None = None) -> bytes:
    """A regular file's bytes (``open_regular``: never blocks on a FIFO or a device)."""
    with open_regular(path, limit=limit, what=what) as f:
        return f.read()


def read_text(path: str | os.PathLike[str], *, limit: int | None = None, what: str | None = None,
              encoding: str = "utf-8") -> str:
    """A regular file's text (``open_regular``)."""
    return read_bytes(path, limit=limit, what=what).decode(encoding)


# --------------------------------------------------------------------------- JSON for strict parsers


def finite_json(value):
    """``value`` with every NaN and infinity replaced by None (JSON null), recursively: what strict
    JSON parsers (jq, JavaScript, Go) accept. Tuples become lists, as ``json`` writes them."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def json_text(value, **dumps_kwargs) -> str:
    """``json.dumps`` for files and stdout a person or a strict parser reads: NaN and infinities
    as null (never the bare ``NaN`` Python writes by default)."""
    import json

    default = dumps_kwargs.pop("default", None)
    if default is not None:  # objects the default turns into data may hold NaN too
        inner = default
        default = lambda obj: finite_json(inner(obj))  # noqa: E731
    return json.dumps(finite_json(value), allow_nan=False, default=default, **dumps_kwargs)
