"""Listing and removal: ``cache ls``, ``resolve``, ``gc``, ``purge`` and the clean-up of what runs leave behind."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from datetime import datetime, timezone

from filelock import lock_descriptor

from enginekit.cache.files import parse_time, remove, remove_children, tree_size
from enginekit.cache.inuse import clean_inuse, in_use
from enginekit.cache.local import STALE_TMP_SECONDS
from enginekit.cache.entries import Entry, EntryInfo
from enginekit.cache.tiered import TieredCache
from enginekit.errors import UsageError
from enginekit.manifest import read_manifest

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
MIN_PREFIX = 6  # hex digits a key prefix needs (`cache show KEY`)


class Cache(TieredCache):
    """A content-addressed store under ``root`` (``default_root()`` when None), the team store under it
    where one is configured, with listing and removal."""

    def ls(self, verify: bool = False) -> list[EntryInfo]:
        """Every entry, most recently used first. Files are checked by size; with ``verify``, by
        sha256 too (which reads every byte).

        Listing changes nothing and is no use: last-used times stay as they were, and a corrupt
        entry shows as ``valid=False`` with its reason.
        """
        rows = []
        verdicts = None  # a graph's stored verdicts (by its content), read once where a graph is listed
        for kind, key, path in self._entry_dirs():
            try:
                last_used = path.stat().st_mtime
            except FileNotFoundError:
                continue  # removed while we listed
            manifest, _ = read_manifest(path)
            result = self._inspect(kind, key, True if verify else "size")
            manifest = manifest or {}
            parity = manifest.get("parity") if kind == "engine" else None
            graph = ((manifest.get("files") or {}).get("model.onnx") or {}).get("sha256") \
                if kind.startswith("onnx-") and isinstance(manifest.get("files"), dict) else None
            if kind == "engine":  # an engine stands on its source graph: every check that graph had counts
                graph = (manifest.get("source_onnx") or {}).get("sha256") if isinstance(
                    manifest.get("source_onnx"), dict) else None
            if graph:
                verdicts = self.verdicts() if verdicts is None else verdicts
                said = [v["passed"] for v in verdicts.get(graph, []) if v["passed"] is not None]
                own = (parity or {}).get("passed") if isinstance(parity, dict) else None
                if own is not None:
                    said.append(own)
                parity = {"passed": all(said)} if said else None
            rows.append(
                EntryInfo(
                    kind=kind,
                    key=key,
                    subject=manifest.get("subject"),
                    size=tree_size(path),
                    created=parse_time(manifest.get("created")),
                    last_used=datetime.fromtimestamp(last_used, timezone.utc),
                    valid=result.status == "hit",
                    reason=result.reason,
                    verified=bool(verify),
                    parity=parity.get("passed") if isinstance(parity, dict) else None,
                )
            )
        rows.sort(key=lambda row: row.last_used, reverse=True)
        return rows

    def engines_of(self, identity: str, precision: str, *, nms: bool = False) -> list[Entry]:
        """The engines built from a model whose weights identity is ``identity`` (its manifest's build request) at
        ``precision``, most recently used first; with ``nms``, those whose graph ends in NMS, else those without."""
        found = []
        for row in self.ls():
            if row.kind != "engine" or not row.valid:
                continue
            entry = self.lookup("engine", row.key, verify=False).entry
            request = (entry.manifest.get("model_request") or {}) if entry is not None else {}
            if request.get("identity") == identity and bool(request.get("nms")) == nms and \
                    (entry.manifest.get("precision") or {}).get("mode") == precision:
                found.append(entry)
        return found

    def verdicts(self) -> dict[str, list[dict]]:
        """Every stored verdict on a graph, by the graph's sha256: ``[{"kind", "key", "precision", "passed"}]`` (parity
        verdicts of export and build, verify's verdicts): how ``deploy``, ``verify`` and ``cache ls`` know a file as
        verified or failed wherever it lies, by its content."""
        found: dict[str, list[dict]] = {}
        for kind in ("parity", "verdict"):
            for entry in self._entries(kind):
                manifest, key = entry.manifest, entry.key
                parts = manifest.get("parts") or {}
                passed = manifest.get("passed") if kind == "parity" else \
                    _report_passed((manifest.get("report") or {}))
                found.setdefault(str(parts.get("graph")), []).append(
                    {"kind": kind, "key": key, "precision": parts.get("precision"), "passed": passed,
                     "at": parts.get("at", "export" if kind == "parity" else "verify")})
        return found

    def verdict_of(self, sha256: str, precision: str | None = None, at: str | None = None) -> dict | None:
        """What the stored verdicts on a graph of this content say (``verdicts``), at ``precision`` where given (and
        only those made ``at`` a step, e.g. ``verify --data``, where given): ``{"passed": False, ...}`` where any
        failed, else the first that passed, else None (none judged it)."""
        said = [v for v in self.verdicts().get(sha256, []) if v["passed"] is not None and
                (precision is None or v["precision"] in (None, precision)) and (at is None or v["at"] == at)]
        failed = [v for v in said if v["passed"] is False]
        return (failed or said or [None])[0]

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
            remove_children(self._trash_root)
        rows = []
        verdicts = None  # a graph's stored verdicts (by its content), read once where a graph is listed
        for kind, key, path in self._entry_dirs():
            try:
                rows.append((path.stat().st_mtime, kind, key, tree_size(path)))
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
                gone = not in_use(self.root, kind, key)
            else:
                gone = self._remove_if_free(kind, key)
            if gone:
                removed.append(key)
                total -= size
        if not dry_run:
            self._clean_locks()
            clean_inuse(self.root)
        return removed

    def purge(self) -> list[str]:
        """Remove every entry whose lock is free, orphaned temp folders, and ``.trash``."""
        if os.path.lexists(self.root):
            self.check_location(writable=True)
        entries = list(self._entry_dirs())  # listed first: removal changes the folders
        removed = [key for kind, key, _ in entries if self._remove_if_free(kind, key)]
        self._clean_tmp(0)
        remove_children(self._trash_root)
        self._clean_locks()
        clean_inuse(self.root)
        return removed

    def _remove_if_free(self, kind: str, key: str) -> bool:
        """Remove an entry unless someone holds its lock or a run is using it; say whether it went.

        Checked again after the entry is moved aside: a run that began using it meanwhile gets it
        back (no build can recreate it in between: the key's lock is held)."""
        with self._try_lock(kind, key) as got:
            path = self.entry_dir(kind, key)
            if not got or not os.path.lexists(path) or in_use(self.root, kind, key):
                return False
            self._folder(self._trash_root)
            aside = self._trash_root / f"{kind}-{key}-{secrets.token_hex(4)}"
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                return False
            if in_use(self.root, kind, key):
                os.rename(aside, path)
                return False
            remove(aside)
            return True

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




def _report_passed(report: dict) -> bool | None:
    """Whether a stored verify verdict (an artifact's report state) passed: every check; None where it ran none."""
    checks = report.get("checks") if isinstance(report, dict) else None
    if not isinstance(checks, list) or not report.get("ran", True) or not checks:
        return None
    return all(isinstance(c, dict) and c.get("passed") for c in checks)
