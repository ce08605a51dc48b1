"""The local cache: entries under one root, written atomically, a lock per key.

``LocalCache`` finds, builds and lists entries; the store under it (``cache.tiered``) and removal
(``cache.admin``) are added by the classes built on it, and ``enginekit.cache.Cache`` is the whole.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from enginekit import reporting
from enginekit.cache.files import changed_parts, fsync_tree, remove, touch, pid_alive
from enginekit.cache.inuse import mark_in_use
from enginekit.cache.entries import Entry, Explanation, LookupResult, default_root, location_problem, root_origin
from enginekit.errors import EnginekitError, UsageError
from enginekit.fsutil import fsync_dir as _fsync_dir
from enginekit.hashing import key_for
from enginekit.manifest import KEY_RE, KIND_RE, MANIFEST, check_kind_key, check_manifest, make_manifest, read_manifest, verify_files, write_json

# Waiting for another process's build: an engine build of a large model can take an hour.
DEFAULT_LOCK_TIMEOUT = 4 * 3600.0
# Kinds the store receives only from the flows, once their gates passed (``Cache.publish``);
# every other kind is pushed as soon as it is built.
PUBLISHED_BY_FLOWS = ("engine",)
# A temp folder younger than this may belong to a build on another host sharing the cache.
STALE_TMP_SECONDS = 3600.0

TMP_RE = re.compile(r"^(?P<kind>.+)-(?P<key>[0-9a-f]{64})-(?P<pid>\d+)-[0-9a-f]+$")

Produce = Callable[[Path], "dict[str, Any] | None"]


class LocalCache:
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
        self._origin = root_origin() if root is None else None
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

    # ----- paths

    def entry_dir(self, kind: str, key: str) -> Path:
        check_kind_key(kind, key)
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
        check_kind_key(kind, key)
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
            touch(result.entry.path)
            mark_in_use(self.root, kind, key)
        return result

    def _inspect(self, kind: str, key: str, verify: bool | str) -> LookupResult:
        """Look at an entry without changing anything. ``verify``: True hashes every file, "size"
        compares sizes only, False reads the manifest alone."""
        self.check_location(writable=False)
        path = self.entry_dir(kind, key)
        if not os.path.lexists(path):
            return LookupResult("miss")
        manifest, reason = read_manifest(path)
        if manifest is not None:
            reason = check_manifest(manifest, kind, key)
        if reason is None and verify:
            reason = verify_files(path, manifest["files"], hash=verify is True)
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
                touch(found.entry.path)
                mark_in_use(self.root, kind, key)
                return found.entry, "hit"
        with self.lock(kind, key):
            # Another process may have built it while we waited for the lock.
            found = self._inspect_and_discard(kind, key, verify=True)
            if found.entry is not None and not force:
                touch(found.entry.path)
                mark_in_use(self.root, kind, key)
                return found.entry, "hit"
            status = "forced" if found.entry is not None else found.status
            if not force:
                pulled = self._pull(kind, key)
                if pulled is not None:
                    mark_in_use(self.root, kind, key)
                    return pulled, "pulled"
            if status == "corrupt":  # shown, not only rebuilt
                    reporting.warning(f"cache entry {kind}/{key[:12]} was corrupt ({found.reason}): removed it, rebuilding")
            entry = self._build(kind, key, parts, produce, subject)
            mark_in_use(self.root, kind, key)
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
            manifest = make_manifest(kind, key, parts, subject, tmp, extra)
            write_json(tmp / MANIFEST, manifest)
            fsync_tree(tmp)
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
            reporting.warning(f"cache: {path} should be one of the cache's folders and was not: removed it")
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _tmp_path(self, kind: str, key: str) -> Path:
        """A new temp folder's path (not made yet: the caller makes it inside its clean-up). Staging folders that
        builds killed outright left (SIGKILL: no clean-up ran) go first, so none outlives the next build."""
        # The pid in the name lets gc tell an orphan (its builder died) from a live build.
        self._folder(self._tmp_root)
        self._clean_tmp(STALE_TMP_SECONDS)
        return self._tmp_root / f"{kind}-{key}-{os.getpid()}-{secrets.token_hex(4)}"

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
            match = TMP_RE.match(name)
            if match is None or not KIND_RE.match(match["kind"]):
                if age >= stale_seconds:
                    remove(path)  # not ours to keep: nothing builds under such a name
                continue
            pid = int(match["pid"])
            if pid == os.getpid() or (pid_alive(pid) and age < stale_seconds):
                continue
            with self._try_lock(match["kind"], match["key"]) as got:
                if got:
                    remove(path)


    def _publish(self, tmp: Path, kind: str, key: str) -> Path:
        """Rename a complete temp folder to the entry's place. Lock held."""
        final = self.entry_dir(kind, key)
        self._folder(final.parent)
        if os.path.lexists(final):
            self._discard(kind, key)  # a stale, corrupt or forced-out entry
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        touch(final)
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
        remove(aside)  # if this fails halfway, gc empties .trash later

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
        diffs = [(e.key, changed_parts(parts, e.manifest["parts"])) for e in candidates]
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
            if k.startswith(".") or not KIND_RE.match(k) or not kind_dir.is_dir():
                continue
            for key in sorted(os.listdir(kind_dir)):
                if KEY_RE.match(key):
                    yield k, key, kind_dir / key

    def _entries(self, kind: str | None = None) -> Iterator[Entry]:
        """Entries whose manifest reads and matches its folder (no file hashing)."""
        for k, key, path in self._entry_dirs(kind):
            manifest, reason = read_manifest(path)
            if manifest is not None and check_manifest(manifest, k, key) is None:
                yield Entry(k, key, path, manifest)

    def entries(self, kind: str | None = None) -> list[Entry]:
        """Entries whose manifest reads and matches its folder (no hashing, no use recorded)."""
        return list(self._entries(kind))

    def forget(self, kind: str, key: str) -> bool:
        """Remove one entry, under its lock (``verify --recheck`` sets a graph's earlier checks aside so); whether
        there was one."""
        with self.lock(kind, key):
            existed = os.path.lexists(self.entry_dir(kind, key))
            self._discard(kind, key)
        return existed

    def has(self, kind: str, key: str) -> bool:
        """Whether a complete-looking entry is here (its manifest only; no use recorded)."""
        return self._inspect(kind, key, verify=False).entry is not None

    def _clean_key_tmp(self, kind: str, key: str) -> None:
        """After a build of ``kind/key`` (its lock held): earlier staging folders of the same key
        belong to builds that died, since no other build of the key can be running."""
        if not self._tmp_root.is_dir():
            return
        prefix = f"{kind}-{key}-"
        for name in os.listdir(self._tmp_root):
            match = TMP_RE.match(name)
            if name.startswith(prefix) and match is not None and int(match["pid"]) != os.getpid():
                remove(self._tmp_root / name)

    # ----- the store under this cache: none here (``cache.tiered.TieredCache`` adds it)

    def _pull_if_missing(self, kind: str, key: str) -> Entry | None:
        return None

    def _pull(self, kind: str, key: str, *, strict: bool = False) -> Entry | None:
        return None

    def _push_quietly(self, entry: Entry) -> None:
        return None
