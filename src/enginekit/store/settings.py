"""Which store the remote tier uses, and how: the environment, or a verb's ``--remote`` flags.

    ENGINEKIT_REMOTE=s3://BUCKET/PREFIX    the store (also file:///PATH or /PATH: a shared folder)
    ENGINEKIT_REMOTE_MODE=read|readwrite   read: never writes (deploy machines, laptops); readwrite
                                           (the default): pushes what it builds (CI)
    ENGINEKIT_REMOTE_TIMEOUT=SECONDS       the longest one request waits (default 10); retried twice

``--remote URL`` and ``--remote-read-only`` on a verb (and ``remote=`` in the Python API) override
the environment for that run (``using``). Endpoint, region and credentials come from the standard
AWS settings. No store is configured when ENGINEKIT_REMOTE is unset or empty, or ``--remote none``.
"""

from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

from enginekit.errors import UsageError
from enginekit.store.s3 import parse_s3_url

MODES = ("read", "readwrite")
DEFAULT_TIMEOUT = 10.0
SCHEMES = ("s3://", "file://", "/")


@dataclass(frozen=True)
class RemoteSettings:
    url: str
    mode: str = "readwrite"
    timeout: float = DEFAULT_TIMEOUT
    origin: str = "ENGINEKIT_REMOTE"  # where the URL came from, for messages

    @property
    def writable(self) -> bool:
        return self.mode == "readwrite"


_override: ContextVar[dict | None] = ContextVar("enginekit_remote_override", default=None)


@contextlib.contextmanager
def using(url: str | None = None, *, read_only: bool = False, mode: str | None = None) -> Iterator[None]:
    """Within this block, ``current()`` takes ``url`` (when given) over ENGINEKIT_REMOTE, and
    ``read_only`` (or ``mode``) over ENGINEKIT_REMOTE_MODE."""
    if url is None and not read_only and mode is None:
        yield
        return
    if mode is not None and mode not in MODES:
        raise UsageError(f"unknown store mode {mode!r}: choose read or readwrite")
    if url is not None and url.strip() and url.strip().lower() != "none":
        check_url(url.strip())
    token = _override.set({"url": url, "mode": "read" if read_only else mode})
    try:
        yield
    finally:
        _override.reset(token)


def current() -> RemoteSettings | None:
    """The store this run uses, or None. Raises ``UsageError`` for a malformed setting."""
    over = _override.get() or {}
    url = over.get("url")
    origin = "--remote"
    if url is None:
        url, origin = os.environ.get("ENGINEKIT_REMOTE", ""), "ENGINEKIT_REMOTE"
    url = url.strip()
    if not url or url.lower() == "none":
        return None
    check_url(url, origin)
    mode = over.get("mode") or os.environ.get("ENGINEKIT_REMOTE_MODE", "").strip().lower() or "readwrite"
    if mode not in MODES:
        raise UsageError(f"ENGINEKIT_REMOTE_MODE={mode!r}: expected read or readwrite")
    timeout_text = os.environ.get("ENGINEKIT_REMOTE_TIMEOUT", "").strip()
    timeout = DEFAULT_TIMEOUT
    if timeout_text:
        try:
            timeout = float(timeout_text)
            if not 0 < timeout <= 3600:
                raise ValueError
        except ValueError as cause:
            raise UsageError(f"ENGINEKIT_REMOTE_TIMEOUT={timeout_text!r}: expected seconds, from 0 to 3600") from cause
    return RemoteSettings(url, mode, timeout, origin)


def check_url(url: str, origin: str = "--remote") -> None:
    if not url.startswith(SCHEMES):
        scheme = url.split("://", 1)[0] + "://" if "://" in url else url
        raise UsageError(f"{origin} {url!r}: unsupported store {scheme!r}; use s3://BUCKET/PREFIX "
                         "(any S3-compatible store) or file:///PATH (a shared folder)")
    if url.startswith("s3://"):
        parse_s3_url(url)
    else:
        folder_of(url, origin)


def folder_of(url: str, origin: str = "--remote") -> str:
    """A shared-folder store's folder (``file:///srv/ek`` or ``/srv/ek``), absolute and normalised: the same
    for every verb whatever the working directory. ``file://`` with no folder, a relative one
    (``file://rel/dir``: its first part would be a host) and the filesystem root (``$UNSET/``) are refused."""
    import posixpath

    path = url[len("file://"):] if url.startswith("file://") else url
    if not path.startswith("/"):
        raise UsageError(f"{origin} {url!r}: a folder store is file:///ABSOLUTE/PATH (three slashes) or /ABSOLUTE/PATH; "
                         + ("it names no folder" if not path else f"{path!r} is relative (or a host name)"))
    folder = posixpath.normpath(path).replace("//", "/")
    if folder == "/":
        raise UsageError(f"{origin} {url!r}: the filesystem root cannot be the team store (an unset variable in "
                         "$VAR/?); name its folder, e.g. file:///srv/enginekit")
    return folder


def check_apart(url: str, cache_root, origin: str = "--remote") -> None:
    """A folder store not inside the local cache: the cache would take the store's files for its own (``cache ls``
    listing the store's objects as corrupt entries, ``cache purge`` deleting them)."""
    import os

    if url.startswith("s3://"):
        return
    store = os.path.realpath(folder_of(url, origin))
    cache = os.path.realpath(os.path.expanduser(str(cache_root)))
    if store == cache or store.startswith(cache.rstrip("/") + "/"):
        raise UsageError(f"{origin} {url!r} is inside the local cache {cache}: the team store needs a folder of its own")
