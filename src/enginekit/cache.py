"""Content-addressed local store with atomic writes and a lock per key.

Every result enginekit computes (an ONNX file, an engine plan, a parity report) is stored under
a key made of everything that determines it, so a second run with the same inputs does no work.

Layout under the root (``default_root()``)::

    <kind>/<key>/                 one entry: the producer's files plus manifest.json
    .locks/<kind>-<key>.lock      one lock per key, held while the key is built or removed
    .tmp/<kind>-<key>-<pid>-<r>/  an entry being built; renamed into place when complete
    .trash/                       entries moved aside before deletion
    .inuse/<kind>-<key>/<pid>-<r> a run using the entry holds a lock on this file: gc and purge
                                  keep the entry (the kernel drops the lock when the run ends)

A reader never sees half an entry: an entry folder only appears by ``os.rename`` of a complete
temp folder that already holds its ``manifest.json``, and only disappears by a rename into
``.trash``. A corrupt entry (missing file, size or sha256 mismatch, unreadable manifest) is
reported and moved aside, never served.

Reporting: ``lookup`` returns a ``LookupResult`` with a status of "hit", "miss" or "corrupt"
and, for "corrupt", the reason. ``get_or_create`` returns ``(entry, status)`` with a status of
"hit", "miss" (built, nothing was there), "corrupt" (rebuilt over a corrupt entry) or "forced"
(rebuilt on request). Both also leave the reason of the last corruption they found in
``Cache.last_corruption`` (None when there was none), so a caller can report it.

Under it, optionally, the team store (``enginekit.store``): lookups go local -> store -> build,
a pulled entry is checked file by file against its sha256 before it is renamed into place, and
what is built is pushed back (engines only once their gates passed: ``publish``). A store that
fails never fails the lookup: one warning, then local only.

Only the standard library, ``filelock`` and ``psutil`` (and the store's client when one is
configured): no torch, onnx or tensorrt here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout, lock_descriptor

from enginekit.errors import EnginekitError, UsageError
from enginekit.fsutil import fsync_dir as _fsync_dir, fsync_file as _fsync_file

MANIFEST = "manifest.json"
MANIFEST_LIMIT = 16 * 2**20  # a manifest is a few kB; a larger one is not one (and is not read whole)
# Manifest fields the cache owns; a producer's extra fields may not overwrite them.
RESERVED_FIELDS = ("kind", "key", "parts", "files", "created", "subject")
# Waiting for another process's build: an engine build of a large model can take an hour.
DEFAULT_LOCK_TIMEOUT = 4 * 3600.0
# Kinds the store receives only from the flows, once their gates passed (``Cache.publish``);
# every other kind is pushed as soon as it is built.
PUBLISHED_BY_FLOWS = ("engine",)
# A temp folder younger than this may belong to a build on another host sharing the cache.
STALE_TMP_SECONDS = 3600.0
MIN_PREFIX = 6

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_KIND_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TMP_RE = re.compile(r"^(?P<kind>.+)-(?P<key>[0-9a-f]{64})-(?P<pid>\d+)-[0-9a-f]+$")

Produce = Callable[[Path], "dict[str, Any] | None"]


# --------------------------------------------------------------------------- keys and hashes


def default_root() -> Path:
    """``$ENGINEKIT_CACHE``, else ``$XDG_CACHE_HOME/enginekit``, else ``~/.cache/enginekit``."""
    if os.environ.get("ENGINEKIT_CACHE"):
        return Path(os.environ["ENGINEKIT_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "enginekit"
    return Path.home() / ".cache" / "enginekit"


def _root_origin() -> str | None:
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


def _canonical(value: Any) -> str:
    """Canonical JSON: same data, same text, whatever the dict order."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def key_for(parts: dict[str, Any]) -> str:
    """sha256 hex of the canonical JSON of ``parts``.

    ``parts`` must hold plain JSON data describing everything that determines the result
    (input hashes, recipe, profiles, backend and target, options) and nothing else: never a
    file's path or a time, or equal inputs would miss. That is the caller's job; a ``Path``
    here fails loudly (it is not JSON) rather than keying on a location.
    """
    return hashlib.sha256(_canonical(parts).encode("utf-8")).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 hex of a file's bytes (streamed: engines and ONNX files are large)."""
    from enginekit.fsutil import open_regular

    with open_regular(path) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# --------------------------------------------------------------------------- size and age flags

# K, M, G, T (with or without B / iB) are binary units here, as du and docker read them; pydantic's
# ByteSize reads "G" as 10**9, so the unit is spelled out as "GiB" before it parses the text.
_SIZE_UNIT_RE = re.compile(r"(?<=[\d\s])([KMGT])(?:I?B)?$", re.IGNORECASE)
_AGE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$", re.IGNORECASE)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


_SIZE_SHAPE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?\s*([KMGT](I?B)?|B)?$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"20G"`` -> bytes. Suffixes K, M, G, T are powers of 1024; no suffix means bytes."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    spelled = _SIZE_UNIT_RE.sub(lambda m: m.group(1).upper() + "iB", str(text).strip())
    try:
        if not _SIZE_SHAPE_RE.match(str(text).strip()):  # ByteSize alone reads "1.5.2G" as 1
            raise ValueError
        return int(TypeAdapter(ByteSize).validate_python(spelled))
    except (ValidationError, ValueError) as cause:
        raise UsageError(
            f"malformed size {text!r}: expected a number with an optional K, M, G or T suffix, "
            "like 20G"
        ) from cause


def parse_age(text: str) -> float:
    """``"30d"`` -> seconds. Units: s, m, h, d, w (a unit is required: "30" is ambiguous)."""
    match = _AGE_RE.match(str(text).strip())
    if not match:
        raise UsageError(
            f"malformed age {text!r}: expected a number with a unit s, m, h, d or w, like 30d"
        )
    number, unit = match.groups()
    return float(number) * _AGE_UNITS[unit.lower()]


# --------------------------------------------------------------------------- results


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


# --------------------------------------------------------------------------- the store


class Cache:
    """A content-addressed store under ``root`` (``default_root()`` when None)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        remote: Any = "settings",
    ) -> None:
        """``remote``: "settings" (ENGINEKIT_REMOTE, or a verb's --remote: ``enginekit.store.using``),
        None (local only), or an ``enginekit.store.tier.Remote``."""
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.lock_timeout = lock_timeout
        self._remote_arg = remote
        self.last_corruption: str | None = None
        self._origin = _root_origin() if root is None else None
        self._location_checked: set[bool] = set()  # modes (writable or not) found fine

    # ----- location

    def location_problem(self, *, writable: bool = True) -> str | None:
        """Why this cache's root cannot be used (for ``doctor``), or None."""
        return location_problem(self.root, writable=writable)

    def check_location(self, *, writable: bool = True) -> None:
        """Raise ``UsageError`` (one line) if the root cannot hold the cache. Checked once per
        mode: every method that reads or writes the store calls it before touching anything."""
        if writable in self._location_checked or True in self._location_checked:
            return
        problem = self.location_problem(writable=writable)
        if problem is not None:
            hint = f" (from {self._origin})" if self._origin else ""
            fix = f"; set {self._origin} to a writable directory" if self._origin else ""
            raise UsageError(f"cannot use the cache at {self.root}{hint}: {problem}{fix}")
        self._location_checked.add(writable)

    @property
    def remote(self):
        """The store under this cache (``enginekit.store.tier.Remote``), or None. Read from the
        settings at each use, so ``store.using`` applies to caches made before it."""
        if self._remote_arg != "settings":
            return self._remote_arg
        from enginekit.store.settings import current

        settings = current()
        if settings is None:
            return None
        from enginekit.store.settings import check_apart
        from enginekit.store.tier import remote_for

        check_apart(settings.url, self.root, settings.origin)
        return remote_for(settings)

    # ----- paths

    def entry_dir(self, kind: str, key: str) -> Path:
        _check_kind_key(kind, key)
        return self.root / kind / key

    @property
    def _tmp_root(self) -> Path:
        return self.root / ".tmp"

    @property
    def _trash_root(self) -> Path:
        return self.root / ".trash"

    def _lock_path(self, kind: str, key: str) -> Path:
        return self.root / ".locks" / f"{kind}-{key}.lock"

    # ----- locks

    def _filelock(self, kind: str, key: str) -> FileLock:
        # One lock object per path in this process (singleton), so nested use is reentrant
        # instead of deadlocking on a second descriptor; timeouts go to acquire() because a
        # singleton must always be constructed with the same arguments.
        _check_kind_key(kind, key)
        self.check_location(writable=True)
        path = self._lock_path(kind, key)
        self._folder(path.parent)
        return FileLock(path, is_singleton=True)

    @contextlib.contextmanager
    def lock(self, kind: str, key: str) -> Iterator[None]:
        """Hold the key's lock (blocking, up to ``lock_timeout`` seconds).

        Reentrant within one thread (so ``get_or_create`` may run inside it). While held, no
        other process builds, replaces or garbage-collects this entry, so its files stay put
        for the holder; ``gc`` in the holding thread itself is not kept out.
        """
        lock = self._filelock(kind, key)
        try:
            lock.acquire(timeout=self.lock_timeout)
        except Timeout as cause:
            raise EnginekitError(
                f"timed out after {self.lock_timeout:.0f}s waiting for the cache lock "
                f"{self._lock_path(kind, key)}"
            ) from cause
        try:
            yield
        finally:
            lock.release()

    @contextlib.contextmanager
    def _try_lock(self, kind: str, key: str) -> Iterator[bool]:
        """Take the key's lock only if it is free right now; yield whether we got it."""
        lock = self._filelock(kind, key)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    # ----- lookup

    def lookup(self, kind: str, key: str, verify: bool = True, *, remote: bool = True) -> LookupResult:
        """Find an entry. With ``verify``, every file's size and sha256 is checked.

        A corrupt entry is moved aside and deleted (under the key's lock, after checking
        again, since a concurrent rebuild can make a lock-free read look corrupt); the result
        then has status "corrupt" and the reason, also kept in ``self.last_corruption``.
        With a store (and ``remote``), an entry missing here is pulled from it: status "pulled".
        """
        self.last_corruption = None
        result = self._inspect(kind, key, verify)
        if result.status == "corrupt":
            with self.lock(kind, key):
                result = self._inspect_and_discard(kind, key, verify)
        if result.entry is None and remote:
            pulled = self._pull_if_missing(kind, key)
            if pulled is not None:
                result = LookupResult("pulled", pulled)
        if result.entry is not None:
            _touch(result.entry.path)
            self._mark_in_use(kind, key)
        return result

    def _inspect(self, kind: str, key: str, verify: bool | str) -> LookupResult:
        """Look at an entry without changing anything. ``verify``: True hashes every file, "size"
        compares sizes only, False reads the manifest alone."""
        self.check_location(writable=False)
        path = self.entry_dir(kind, key)
        if not os.path.lexists(path):
            return LookupResult("miss")
        manifest, reason = _read_manifest(path)
        if manifest is not None:
            reason = _check_manifest(manifest, kind, key)
        if reason is None and verify:
            reason = _verify_files(path, manifest["files"], hash=verify is True)
        if reason is not None:
            return LookupResult("corrupt", reason=reason)
        return LookupResult("hit", Entry(kind, key, path, manifest))

    def _inspect_and_discard(self, kind: str, key: str, verify: bool | str) -> LookupResult:
        """``_inspect``, and move a corrupt entry aside. Call with the key's lock held."""
        result = self._inspect(kind, key, verify)
        if result.status == "corrupt":
            self._discard(kind, key)
            self.last_corruption = f"{kind}/{key[:10]}: {result.reason}"
        return result

    # ----- build

    def get_or_create(
        self,
        kind: str,
        parts: dict[str, Any],
        produce: Produce,
        *,
        force: bool = False,
        subject: str | None = None,
    ) -> tuple[Entry, str]:
        """The entry for ``parts``, built by ``produce(tmpdir)`` if absent.

        ``produce`` writes its files into ``tmpdir`` and returns extra manifest fields (or
        None). Returns ``(entry, status)``, status one of "hit", "miss", "corrupt", "forced".
        If ``produce`` raises, nothing is stored and the exception propagates.
        """
        key = key_for(parts)
        self.last_corruption = None
        if not force:
            # Fast path: a complete entry needs no lock (entries appear only by rename).
            found = self._inspect(kind, key, verify=True)
            if found.entry is not None:
                _touch(found.entry.path)
                self._mark_in_use(kind, key)
                return found.entry, "hit"
        with self.lock(kind, key):
            # Another process may have built it while we waited for the lock.
            found = self._inspect_and_discard(kind, key, verify=True)
            if found.entry is not None and not force:
                _touch(found.entry.path)
                self._mark_in_use(kind, key)
                return found.entry, "hit"
            status = "forced" if found.entry is not None else found.status
            if not force:
                pulled = self._pull(kind, key)
                if pulled is not None:
                    self._mark_in_use(kind, key)
                    return pulled, "pulled"
            if status == "corrupt":  # shown, not only rebuilt
                from enginekit import reporting

                reporting.warning(f"cache entry {kind}/{key[:12]} was corrupt ({found.reason}): removed it, rebuilding")
            entry = self._build(kind, key, parts, produce, subject)
            self._mark_in_use(kind, key)
            if kind not in PUBLISHED_BY_FLOWS:
                self._push_quietly(entry)
            return entry, status

    def _build(
        self, kind: str, key: str, parts: dict[str, Any], produce: Produce, subject: str | None
    ) -> Entry:
        """Produce into a temp folder, describe it, and rename it into place. Lock held."""
        tmp = self._tmp_path(kind, key)
        try:
            tmp.mkdir()  # made inside the try: a signal right after it still removes it
            extra = produce(tmp)
            manifest = _make_manifest(kind, key, parts, subject, tmp, extra)
            _write_json(tmp / MANIFEST, manifest)
            _fsync_tree(tmp)
            path = self._publish(tmp, kind, key)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._clean_key_tmp(kind, key)
        return Entry(kind, key, path, manifest)

    def _folder(self, path: Path) -> Path:
        """One of the cache's own folders (a kind's, ``.tmp``, ``.trash``), made where missing. Where
        something else stands in its place (a file, a dangling link), that is damage to the cache:
        reported, removed and replaced, as a corrupt entry is. A link to a folder is a folder."""
        if os.path.lexists(path) and not path.is_dir():
            from enginekit import reporting

            reporting.warning(f"cache: {path} should be one of the cache's folders and was not: removed it")
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _tmp_path(self, kind: str, key: str) -> Path:
        """A new temp folder's path (not made yet: the caller makes it inside its clean-up)."""
        # The pid in the name lets gc tell an orphan (its builder died) from a live build.
        self._folder(self._tmp_root)
        return self._tmp_root / f"{kind}-{key}-{os.getpid()}-{secrets.token_hex(4)}"

    def _publish(self, tmp: Path, kind: str, key: str) -> Path:
        """Rename a complete temp folder to the entry's place. Lock held."""
        final = self.entry_dir(kind, key)
        self._folder(final.parent)
        if os.path.lexists(final):
            self._discard(kind, key)  # a stale, corrupt or forced-out entry
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        _touch(final)
        return final

    def _discard(self, kind: str, key: str) -> None:
        """Move an entry aside in one rename, then delete it. Lock held."""
        path = self.entry_dir(kind, key)
        self._folder(self._trash_root)
        aside = self._trash_root / f"{kind}-{key}-{secrets.token_hex(4)}"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return
        _remove(aside)  # if this fails halfway, gc empties .trash later

    # ----- the store under this cache

    def _pull_if_missing(self, kind: str, key: str) -> Entry | None:
        """Pull a missing entry from the store (under the key's lock), or None. Never raises for
        the store's faults: they are reported once and the caller goes on locally."""
        remote = self.remote
        if remote is None or not remote.available():
            return None
        if self.location_problem(writable=True) is not None:
            return None  # a read-only cache serves what it has
        with self.lock(kind, key):
            found = self._inspect(kind, key, verify=True)
            if found.entry is not None:  # another process got it first
                return found.entry
            return self._pull(kind, key)

    def _pull(self, kind: str, key: str, *, strict: bool = False) -> Entry | None:
        """Fetch ``kind/key`` from the store into a temp folder and rename it into place. Lock held.

        Quiet (the default): a store fault is one warning for the run, a corrupt or truncated
        object one warning naming entry and object; both give None (nothing is used). ``strict``
        raises them instead (``StoreError``; ``UsageError`` for a corrupt object)."""
        remote = self.remote
        if remote is None or (not strict and not remote.available()):
            return None
        from enginekit import reporting
        from enginekit.store.tier import CorruptObject

        tmp = self._tmp_path(kind, key)
        try:
            tmp.mkdir()
            try:
                if strict:
                    manifest = remote.fetch(kind, key, tmp)
                else:
                    manifest = remote.quietly(remote.fetch, kind, key, tmp)
            except CorruptObject as exc:
                if strict:
                    raise UsageError(f"{exc}: not used") from exc
                reporting.warning(f"{exc}: not used")
                manifest = None
            if manifest is None:
                shutil.rmtree(tmp, ignore_errors=True)
                return None
            # Not flushed to disk as a build is: what a power cut could tear is found by the size and
            # sha256 check of every hit, and pulled again (it was checked once already, on arrival).
            path = self._publish(tmp, kind, key)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        size = sum(int(r.get("size", 0)) for r in manifest["files"].values())
        reporting.note(f"pulled {kind}/{key[:12]} from {remote.url} ({size / 2**20:.1f} MiB, sha256 checked)", level=1)
        return Entry(kind, key, path, manifest)

    def _pull_prefix(self, prefix: str) -> Entry | None:
        """The store's one entry whose key starts with ``prefix``, pulled; None when it has none."""
        remote = self.remote
        rows = remote.quietly(remote.entries, manifests=False) or []
        matches = sorted({(r.kind, r.key) for r in rows if r.key.startswith(prefix)})
        if len(matches) > 1:
            listed = ", ".join(f"{k}/{key[:12]}" for k, key in matches[:5])
            raise UsageError(f"cache key prefix {prefix!r} is ambiguous in the store {remote.url}: matches {listed}")
        if not matches:
            return None
        return self.lookup(*matches[0]).entry

    def _push_quietly(self, entry: Entry) -> None:
        remote = self.remote
        if remote is not None and remote.writable:
            remote.quietly(remote.publish, entry.path, entry.manifest, writing=True)

    def publish(self, entries: list[Entry], *, engine: Entry | None = None,
                verdict: dict | None = None) -> bool | None:
        """Push ``entries`` (a build's chain) and then ``engine`` with its index record, where a
        store is configured for writing. For the flows, once the engine passed its gates; never
        raises for the store's faults. Returns True when this call published the engine, False
        when the store had it, None when nothing could be pushed."""
        remote = self.remote
        if remote is None or not remote.writable:
            return None
        for entry in entries:
            if entry is not None:
                self._push_quietly(entry)
        if engine is None:
            return None
        done = remote.quietly(remote.publish, engine.path, engine.manifest, writing=True)
        if done is not None:
            remote.quietly(remote.write_index, engine.manifest, verdict, writing=True)
        return done

    def push(self, entry: Entry) -> bool:
        """``cache push``: publish one entry (an engine with its index record). Raises ``StoreError``.
        True when this call published it, False when the store had it."""
        remote = self.require_remote(write=True)
        done = remote.publish(entry.path, entry.manifest)
        if entry.kind == "engine":
            remote.write_index(entry.manifest)
        return done

    def pull(self, kind: str, key: str) -> tuple[Entry, str]:
        """``cache pull``: the entry, from here ("hit") or from the store ("pulled"). Raises
        ``StoreError`` for the store's faults, ``UsageError`` when it has no such entry or a
        corrupt object."""
        self.require_remote(write=False)
        found = self._inspect(kind, key, verify=True)
        if found.entry is not None:
            return found.entry, "hit"
        with self.lock(kind, key):
            found = self._inspect_and_discard(kind, key, verify=True)
            if found.entry is not None:
                return found.entry, "hit"
            entry = self._pull(kind, key, strict=True)
        if entry is None:
            raise UsageError(f"the store {self.remote.url} has no entry {kind}/{key[:12]}")
        return entry, "pulled"

    def require_remote(self, *, write: bool):
        """The configured store (for the verbs that need one), else a one-line ``UsageError``."""
        remote = self.remote
        if remote is None:
            raise UsageError("no store configured: set ENGINEKIT_REMOTE=s3://BUCKET/PREFIX or pass --remote URL")
        if write and not remote.settings.writable:
            raise UsageError(f"the store {remote.url} is read-only here (--remote-read-only or "
                             "ENGINEKIT_REMOTE_MODE=read): nothing is pushed")
        remote.store.check(write=write)  # there, a folder (a bucket), writable: before any object is written
        return remote

    # ----- entries in use

    def _mark_in_use(self, kind: str, key: str) -> None:
        """While a run (``holding_entries``) goes on, hold a lock that tells gc and purge this entry is
        in use. Nothing outside a run; a cache that cannot be written is simply not marked."""
        if not _SCOPE["depth"]:
            return
        folder = self.root / ".inuse" / f"{kind}-{key}"
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

    def _in_use(self, kind: str, key: str) -> bool:
        """Whether a live run holds a marker of this entry; markers of ended runs are removed."""
        return _markers_held(self.root / ".inuse" / f"{kind}-{key}")

    def _clean_inuse(self) -> None:
        folder = self.root / ".inuse"
        if folder.is_symlink() or not folder.is_dir():
            return
        for name in os.listdir(folder):
            _markers_held(folder / name)

    # ----- explain

    def explain(self, kind: str, parts: dict[str, Any], subject: str | None = None) -> Explanation:
        """Say whether ``parts`` hits, and if not, which top-level parts changed.

        Compares with the earlier entries of ``kind`` (of ``subject`` too, if given) and names
        the parts that differ from the closest one (fewest differing parts; newest on a tie).
        Checks the manifest only, not file hashes: this is a report, not a read.
        """
        key = key_for(parts)
        if self._inspect(kind, key, verify=False).status == "hit":
            return Explanation("hit", key, subject)
        candidates = [
            entry
            for entry in self._entries(kind)
            if isinstance(entry.manifest.get("parts"), dict)
            and (subject is None or entry.subject == subject)
        ]
        if not candidates:
            return Explanation("miss", key, subject)
        # Newest first, so min() breaks ties in favour of the latest entry.
        candidates.sort(key=lambda e: str(e.manifest.get("created", "")), reverse=True)
        diffs = [(e.key, _changed_parts(parts, e.manifest["parts"])) for e in candidates]
        closest, changed = min(diffs, key=lambda d: len(d[1]))
        return Explanation("miss", key, subject, closest_key=closest, changed=changed)

    # ----- listing and resolving

    def _entry_dirs(self, kind: str | None = None) -> Iterator[tuple[str, str, Path]]:
        """(kind, key, folder) of every entry folder, without reading anything."""
        self.check_location(writable=False)
        if not self.root.is_dir():
            return
        kinds = [kind] if kind is not None else sorted(os.listdir(self.root))
        for k in kinds:
            kind_dir = self.root / k
            if k.startswith(".") or not _KIND_RE.match(k) or not kind_dir.is_dir():
                continue
            for key in sorted(os.listdir(kind_dir)):
                if _KEY_RE.match(key):
                    yield k, key, kind_dir / key

    def _entries(self, kind: str | None = None) -> Iterator[Entry]:
        """Entries whose manifest reads and matches its folder (no file hashing)."""
        for k, key, path in self._entry_dirs(kind):
            manifest, reason = _read_manifest(path)
            if manifest is not None and _check_manifest(manifest, k, key) is None:
                yield Entry(k, key, path, manifest)

    def entries(self, kind: str | None = None) -> list[Entry]:
        """Entries whose manifest reads and matches its folder (no hashing, no use recorded)."""
        return list(self._entries(kind))

    def has(self, kind: str, key: str) -> bool:
        """Whether a complete-looking entry is here (its manifest only; no use recorded)."""
        return self._inspect(kind, key, verify=False).entry is not None

    def ls(self, verify: bool = False) -> list[EntryInfo]:
        """Every entry, most recently used first. Files are checked by size; with ``verify``, by
        sha256 too (which reads every byte).

        Listing changes nothing and is no use: last-used times stay as they were, and a corrupt
        entry shows as ``valid=False`` with its reason.
        """
        rows = []
        for kind, key, path in self._entry_dirs():
            try:
                last_used = path.stat().st_mtime
            except FileNotFoundError:
                continue  # removed while we listed
            manifest, _ = _read_manifest(path)
            result = self._inspect(kind, key, True if verify else "size")
            manifest = manifest or {}
            parity = manifest.get("parity") if kind == "engine" else None
            rows.append(
                EntryInfo(
                    kind=kind,
                    key=key,
                    subject=manifest.get("subject"),
                    size=_tree_size(path),
                    created=_parse_time(manifest.get("created")),
                    last_used=datetime.fromtimestamp(last_used, timezone.utc),
                    valid=result.status == "hit",
                    reason=result.reason,
                    verified=bool(verify),
                    parity=parity.get("passed") if isinstance(parity, dict) else None,
                )
            )
        rows.sort(key=lambda row: row.last_used, reverse=True)
        return rows

    def resolve(self, key_prefix: str) -> Entry:
        """The verified entry whose key starts with ``key_prefix`` (at least 6 hex digits).

        Raises ``UsageError`` for a short, malformed, unknown or ambiguous prefix, and for an
        entry found corrupt (which is then removed, as ``lookup`` does).
        """
        prefix = key_prefix.strip().lower()
        if not re.fullmatch(r"[0-9a-f]+", prefix) or len(prefix) > 64:
            raise UsageError(f"malformed cache key {key_prefix!r}: expected hex digits")
        if len(prefix) < MIN_PREFIX:
            raise UsageError(
                f"cache key prefix {key_prefix!r} is too short: "
                f"give at least {MIN_PREFIX} characters"
            )
        matches = [(k, key) for k, key, _ in self._entry_dirs() if key.startswith(prefix)]
        if not matches and self.remote is not None:  # read through: the store's entry, pulled
            pulled = self._pull_prefix(prefix)
            if pulled is not None:
                return pulled
        if not matches:
            raise UsageError(f"no cache entry has a key starting with {prefix!r}")
        if len(matches) > 1:
            listed = ", ".join(f"{k}/{key[:12]}" for k, key in matches[:5])
            raise UsageError(f"cache key prefix {prefix!r} is ambiguous: matches {listed}")
        kind, key = matches[0]
        result = self.lookup(kind, key)
        if result.status == "corrupt":
            raise UsageError(
                f"cache entry {kind}/{key[:12]} was corrupt ({result.reason}); removed it"
            )
        if result.entry is None:
            raise UsageError(f"no cache entry has a key starting with {prefix!r}")
        return result.entry

    # ----- removal

    def gc(
        self,
        max_size_bytes: int | None = None,
        max_age_seconds: float | None = None,
        *,
        stale_tmp_seconds: float = STALE_TMP_SECONDS,
        dry_run: bool = False,
    ) -> list[str]:
        """Remove entries unused for longer than ``max_age_seconds``, then least recently used
        ones until the total is at most ``max_size_bytes``. Returns the removed keys (with
        ``dry_run``, those it would remove, removing nothing).

        An entry whose lock another process holds, or that a run is using (``holding_entries``),
        is never removed (it still counts toward the size). Also removes orphaned temp folders
        (older than ``stale_tmp_seconds``, builder gone, lock free) and leftovers in ``.trash``.
        """
        if os.path.lexists(self.root) and not dry_run:
            self.check_location(writable=True)
        if not dry_run:
            self._clean_tmp(stale_tmp_seconds)
            _remove_children(self._trash_root)
        rows = []
        for kind, key, path in self._entry_dirs():
            try:
                rows.append((path.stat().st_mtime, kind, key, _tree_size(path)))
            except FileNotFoundError:
                continue
        rows.sort()  # least recently used first
        total = sum(row[3] for row in rows)
        now = time.time()
        removed = []
        for last_used, kind, key, size in rows:
            too_old = max_age_seconds is not None and now - last_used > max_age_seconds
            too_big = max_size_bytes is not None and total > max_size_bytes
            if not (too_old or too_big):
                continue
            if dry_run:
                gone = not self._in_use(kind, key)
            else:
                gone = self._remove_if_free(kind, key)
            if gone:
                removed.append(key)
                total -= size
        if not dry_run:
            self._clean_locks()
            self._clean_inuse()
        return removed

    def purge(self) -> list[str]:
        """Remove every entry whose lock is free, orphaned temp folders, and ``.trash``."""
        if os.path.lexists(self.root):
            self.check_location(writable=True)
        entries = list(self._entry_dirs())  # listed first: removal changes the folders
        removed = [key for kind, key, _ in entries if self._remove_if_free(kind, key)]
        self._clean_tmp(0)
        _remove_children(self._trash_root)
        self._clean_locks()
        self._clean_inuse()
        return removed

    def _remove_if_free(self, kind: str, key: str) -> bool:
        """Remove an entry unless someone holds its lock or a run is using it; say whether it went.

        Checked again after the entry is moved aside: a run that began using it meanwhile gets it
        back (no build can recreate it in between: the key's lock is held)."""
        with self._try_lock(kind, key) as got:
            path = self.entry_dir(kind, key)
            if not got or not os.path.lexists(path) or self._in_use(kind, key):
                return False
            self._folder(self._trash_root)
            aside = self._trash_root / f"{kind}-{key}-{secrets.token_hex(4)}"
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                return False
            if self._in_use(kind, key):
                os.rename(aside, path)
                return False
            _remove(aside)
            return True

    def _clean_tmp(self, stale_seconds: float) -> None:
        """Remove staging folders no build owns any more.

        A build holds its key's lock for the whole life of its staging folder, so a folder whose
        key lock is free is an orphan once its builder's pid is gone (a killed build), or once it
        is older than ``stale_seconds`` (a builder on another host sharing the cache, whose pid
        means nothing here). This process's own folders are left alone.
        """
        if not self._tmp_root.is_dir():
            return
        now = time.time()
        for name in os.listdir(self._tmp_root):
            path = self._tmp_root / name
            try:
                age = now - path.lstat().st_mtime
            except FileNotFoundError:
                continue
            match = _TMP_RE.match(name)
            if match is None or not _KIND_RE.match(match["kind"]):
                if age >= stale_seconds:
                    _remove(path)  # not ours to keep: nothing builds under such a name
                continue
            pid = int(match["pid"])
            if pid == os.getpid() or (_pid_alive(pid) and age < stale_seconds):
                continue
            with self._try_lock(match["kind"], match["key"]) as got:
                if got:
                    _remove(path)

    def _clean_key_tmp(self, kind: str, key: str) -> None:
        """After a build of ``kind/key`` (its lock held): earlier staging folders of the same key
        belong to builds that died, since no other build of the key can be running."""
        if not self._tmp_root.is_dir():
            return
        prefix = f"{kind}-{key}-"
        for name in os.listdir(self._tmp_root):
            match = _TMP_RE.match(name)
            if name.startswith(prefix) and match is not None and int(match["pid"]) != os.getpid():
                _remove(self._tmp_root / name)

    def _clean_locks(self) -> None:
        """Remove empty lock files no process holds (each finished or failed run leaves one).

        Taken with filelock's own primitive on the file (``lock_descriptor``, non-blocking), then
        unlinked while held: a process that opened the old file meanwhile finds it unlinked once it
        gets the lock and opens the path again (filelock checks ``st_nlink``). Symlinks are never
        followed.
        """
        locks = self.root / ".locks"
        if locks.is_symlink() or not locks.is_dir():
            return
        for name in os.listdir(locks):
            if not name.endswith(".lock"):
                continue
            path = locks / name
            try:
                fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
            except OSError:
                continue  # gone, a symlink, or unreadable
            try:
                try:
                    if not lock_descriptor(fd, blocking=False):
                        continue  # held by a live process
                except OSError:
                    return  # no locking primitive here: leave lock files alone
                st = os.fstat(fd)
                with contextlib.suppress(FileNotFoundError):
                    if st.st_size == 0 and os.path.samestat(os.lstat(path), st):
                        path.unlink()
            finally:
                os.close(fd)


# --------------------------------------------------------------------------- entries in use

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


def _markers_held(folder: Path) -> bool:
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
                _remove(path)
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


# --------------------------------------------------------------------------- helpers


def _check_kind_key(kind: str, key: str) -> None:
    # Both become path components: refuse anything that could leave the root.
    if not _KIND_RE.match(kind):
        raise ValueError(f"bad cache kind {kind!r}")
    if not _KEY_RE.match(key):
        raise ValueError(f"bad cache key {key!r}: expected 64 hex digits")


def _read_manifest(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, None) or (None, reason)."""
    try:
        from enginekit.fsutil import read_text

        text = read_text(path / MANIFEST, limit=MANIFEST_LIMIT)
    except FileNotFoundError:
        return None, f"{MANIFEST} is missing"
    except OSError as exc:
        return None, f"{MANIFEST} is unreadable: {exc.strerror or exc}"
    try:
        manifest = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, f"{MANIFEST} is not valid JSON"
    except RecursionError:  # `[[[[...`: the decoder recurses per level
        return None, f"{MANIFEST} is nested too deeply to be a manifest"
    if not isinstance(manifest, dict):
        return None, f"{MANIFEST} is not a JSON object"
    return manifest, None


def _check_manifest(manifest: dict[str, Any], kind: str, key: str) -> str | None:
    """Reason the manifest does not belong to this folder, or None."""
    if manifest.get("key") != key:
        return f"{MANIFEST} names key {str(manifest.get('key'))[:10]!r}, not the folder's"
    if manifest.get("kind") != kind:
        return f"{MANIFEST} names kind {manifest.get('kind')!r}, not {kind!r}"
    if not isinstance(manifest.get("files"), dict):
        return f"{MANIFEST} has no file list"
    return None


def _verify_files(path: Path, files: dict[str, Any], *, hash: bool = True) -> str | None:
    """Reason the first listed file fails its recorded size (or, with ``hash``, sha256), or None."""
    for name, record in files.items():
        if not isinstance(record, dict) or Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{MANIFEST} has a bad record for {name!r}"
        file = path / name
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if size != record.get("size"):
            return f"{name} has {size} bytes, {record.get('size')} recorded"
        if hash and sha256_file(file) != record.get("sha256"):
            return f"{name} does not match its recorded sha256"
    return None


def _make_manifest(
    kind: str, key: str, parts: dict[str, Any], subject: str | None, folder: Path, extra: Any
) -> dict[str, Any]:
    """The cache's own fields, then the producer's extra fields (which may not replace them)."""
    extra = {} if extra is None else extra
    if not isinstance(extra, dict):
        raise TypeError(f"produce must return a dict or None, not {type(extra).__name__}")
    clash = sorted(set(extra) & set(RESERVED_FIELDS))
    if clash:
        raise ValueError(f"produce returned reserved manifest fields: {', '.join(clash)}")
    if (folder / MANIFEST).exists():
        raise ValueError(f"produce must not write {MANIFEST}: the cache writes it")
    files = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = file.relative_to(folder).as_posix()
        files[name] = {"sha256": sha256_file(file), "size": file.stat().st_size}
    manifest = {
        "kind": kind,
        "key": key,
        "subject": subject,
        "parts": parts,
        "files": files,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    manifest.update(extra)
    return manifest


def _write_json(path: Path, data: dict[str, Any]) -> None:
    from enginekit.fsutil import json_text

    with open(path, "w", encoding="utf-8") as f:
        f.write(json_text(data, indent=2, ensure_ascii=False) + "\n")  # strict JSON: NaN is null


def _fsync_tree(folder: Path) -> None:
    """Flush every file and folder to disk, so the rename never publishes unwritten data."""
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            _fsync_file(os.path.join(dirpath, name))
        _fsync_dir(Path(dirpath))


def _touch(path: Path) -> None:
    """Record a use: the entry folder's mtime is its last-used time (gc evicts by it)."""
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache still serves hits


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _remove_children(folder: Path) -> None:
    if folder.is_dir():
        for name in os.listdir(folder):
            _remove(folder / name)


def _tree_size(path: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _pid_alive(pid: int) -> bool:
    import psutil

    return pid > 0 and psutil.pid_exists(pid)


def _changed_parts(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """Top-level keys whose values differ (compared as canonical JSON: tuple == list)."""
    missing = object()

    def same(k: str) -> bool:
        a, b = new.get(k, missing), old.get(k, missing)
        if a is missing or b is missing:
            return False
        return _canonical(a) == _canonical(b)

    return [k for k in new if not same(k)] + [k for k in old if k not in new]


def _parse_time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
