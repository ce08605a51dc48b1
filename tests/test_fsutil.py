"""fsutil: whole files or nothing, and no two writers sharing a temporary file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from enginekit.errors import first_line
from enginekit.fsutil import atomic_copy, atomic_write, atomic_write_bytes, atomic_write_text


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path):
    target = tmp_path / "sub" / "a.bin"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in target.parent.iterdir()] == ["a.bin"]


def test_failed_write_keeps_the_old_file(tmp_path: Path):
    target = tmp_path / "a.txt"
    atomic_write_text(target, "old\n")
    with pytest.raises(RuntimeError):
        with atomic_write(target, "w") as f:
            f.write("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_concurrent_writers_never_mix(tmp_path: Path):
    target = tmp_path / "x.bin"
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    threads = [threading.Thread(target=atomic_write_bytes, args=(target, p)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_atomic_copy(tmp_path: Path):
    src = tmp_path / "src"
    src.write_bytes(b"abc")
    assert atomic_copy(src, tmp_path / "out" / "dst").read_bytes() == b"abc"


def test_atomic_write_refuses_append(tmp_path: Path):
    with pytest.raises(ValueError):
        with atomic_write(tmp_path / "a", "a"):
            pass


@pytest.mark.parametrize("error, limit, expected", [
    (ValueError("first\nsecond"), None, "first"),
    (ValueError("  \n"), None, "ValueError"),
    (KeyError(), None, "KeyError"),
    ("x" * 300, 200, "x" * 200),
])
def test_first_line(error, limit, expected):
    assert first_line(error, limit) == expected


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask(tmp_path: Path, umask: int):
    """Not the temporary file's 0600: what a plain open() would give."""
    import os

    from enginekit.fsutil import current_umask

    old = os.umask(umask)
    try:
        assert current_umask() == umask
        atomic_write_text(tmp_path / "a.txt", "x")
        atomic_copy(tmp_path / "a.txt", tmp_path / "b.txt")
    finally:
        os.umask(old)
    for name in ("a.txt", "b.txt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask
