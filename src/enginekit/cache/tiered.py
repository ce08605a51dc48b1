"""The team store under the local cache: lookups go local -> store -> build, what is built is pushed back.

The store (``enginekit.store.tier.Remote``) is given to the cache (``Cache(remote=...)``) or read from the
settings (ENGINEKIT_REMOTE, a verb's --remote) at each use; the store knows nothing of the cache.
"""

from __future__ import annotations

import shutil

from enginekit import reporting
from enginekit.cache.local import LocalCache
from enginekit.cache.entries import Entry
from enginekit.errors import UsageError
from enginekit.store.settings import check_apart, current
from enginekit.store.tier import CorruptObject, remote_for


class TieredCache(LocalCache):
    """A local cache with the team store under it (where one is configured)."""

    @property
    def remote(self):
        """The store under this cache (``enginekit.store.tier.Remote``), or None. Read from the
        settings at each use, so ``store.using`` applies to caches made before it."""
        if self._remote_arg != "settings":
            return self._remote_arg
        settings = current()
        if settings is None:
            return None
        check_apart(settings.url, self.root, settings.origin)
        return remote_for(settings)

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

