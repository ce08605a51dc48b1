"""The remote tier under the local cache: what goes where in the store, and how it moves.

Layout under the store's URL (``s3://BUCKET/PREFIX``)::

    blobs/sha256/ab/ab12...            a file's bytes, named by their sha256 (written first)
    entries/<kind>/<key>.json          an entry's manifest.json, byte for byte (written after
                                       every blob it lists: an entry exists once this does)
    index/<identity>/<key>.json        engines: identity, hardware and verdict (written last;
                                       ``enginekit.store.identity``)
    reports/<key>/<sha256>.json        verify reports of an engine

Publication is atomic for readers: blobs are immutable and content-addressed, and an entry
becomes visible only when its manifest is written, in one request, after all of them; the
manifest is written only where none is (a conditional write), so two publishers of one key both
succeed and leave one entry. A pull checks every file's size and sha256 against the manifest
before the entry is renamed into the local cache; a corrupt or truncated object is reported in
one line naming the entry and object, and never used.

A store that fails (unreachable, slow, refusing) never fails a build that can go on locally:
``Remote.quietly`` turns the first failure into one warning line, and the store is skipped for
the rest of the run (``RETRY_AFTER`` seconds in a long-lived process).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from enginekit.manifest import MANIFEST, check_manifest
from enginekit.store.base import ObjectInfo, ObjectStore, StoreError
from enginekit.store.identity import hardware_of, identity_hash, identity_of
from enginekit.store.settings import RemoteSettings
from enginekit import reporting
from enginekit.fsutil import is_disk_full
from enginekit.store.filesystem import FileStore
from enginekit.store.s3 import S3Store

BLOBS = "blobs/sha256/"
ENTRIES = "entries/"
INDEX = "index/"
REPORTS = "reports/"
RETRY_AFTER = 60.0
# gc keeps blobs no manifest names yet for this long: a publisher may be uploading them
BLOB_GRACE_SECONDS = 3600.0


class CorruptObject(Exception):
    """A remote object that does not match what its manifest records."""


def blob_name(sha: str) -> str:
    return f"{BLOBS}{sha[:2]}/{sha}"


def manifest_name(kind: str, key: str) -> str:
    return f"{ENTRIES}{kind}/{key}.json"


def index_name(identity: dict, key: str) -> str:
    return f"{INDEX}{identity_hash(identity)}/{key}.json"


def open_store(settings: RemoteSettings) -> ObjectStore:
    """The store module for a URL's scheme: one line per kind of store."""
    if settings.url.startswith("s3://"):
        return S3Store(settings.url, timeout=settings.timeout)

    return FileStore(settings.url)


@dataclass
class RemoteEntry:
    kind: str
    key: str
    info: ObjectInfo
    manifest: dict | None = None

    @property
    def size(self) -> int:
        files = (self.manifest or {}).get("files") or {}
        return sum(int(r.get("size", 0)) for r in files.values() if isinstance(r, dict))

    def to_json(self) -> dict:
        m = self.manifest or {}
        out = {"kind": self.kind, "key": self.key, "subject": m.get("subject"), "size_bytes": self.size,
               "created": m.get("created"),
               "published": self.info.modified.isoformat(timespec="seconds") if self.info.modified else None}
        if self.kind == "engine" and m:
            out["hardware"] = hardware_of(m)
            out["parity_passed"] = (m.get("parity") or {}).get("passed")
        return out


@dataclass
class GcPlan:
    entries: list[RemoteEntry] = field(default_factory=list)  # removed (or, dry run, to remove)
    blobs: list[ObjectInfo] = field(default_factory=list)
    kept: int = 0

    @property
    def freed(self) -> int:
        return sum(b.size for b in self.blobs)


class Remote:
    """One store, in one mode, for one process (``remote_for``): the failure state is shared."""

    def __init__(self, settings: RemoteSettings, store: ObjectStore | None = None):
        self.settings = settings
        self._store = store
        self._lock = threading.Lock()
        self.down: StoreError | None = None
        self._down_at = 0.0
        self.no_write: StoreError | None = None

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def writable(self) -> bool:
        return self.settings.writable and self.no_write is None

    @property
    def store(self) -> ObjectStore:
        with self._lock:
            if self._store is None:
                self._store = open_store(self.settings)
            return self._store

    # -- failures: one warning, then the store is skipped ----------------------------------------
    def available(self) -> bool:
        if self.down is not None and time.monotonic() - self._down_at > RETRY_AFTER:
            self.down = None
        return self.down is None

    def quietly(self, fn: Callable[..., Any], *args, writing: bool = False, **kwargs) -> Any:
        """``fn(*args)``, or None after saying (once) why the store is skipped. A refused write keeps
        reads going; any other failure skips the store for the rest of the run."""
        if not self.available() or (writing and not self.writable):
            return None
        try:
            return fn(*args, **kwargs)
        except StoreError as exc:
            if writing and exc.fault == "denied":  # a read-only identity: reads go on
                if self.no_write is None:
                    self.no_write = exc
                    reporting.warning(f"{exc}; nothing is pushed (local cache only)")
                return None
            if self.down is None:
                self.down, self._down_at = exc, time.monotonic()
                reporting.warning(f"{exc}; going on without the store (local cache only)")
            return None
        except CorruptObject:
            raise
        except Exception as exc:  # noqa: BLE001 - the client's own fault: the build goes on all the same
            if isinstance(exc, OSError) and _disk_full(exc):
                raise
            if self.down is None:
                self.down, self._down_at = StoreError(str(exc)), time.monotonic()
                reporting.warning(f"the store {self.url} failed ({type(exc).__name__}: {str(exc)[:200]}); "
                                  "going on without the store (local cache only)")
            return None

    # -- reading ---------------------------------------------------------------------------------
    def manifest(self, kind: str, key: str) -> dict | None:
        data = self.store.get(manifest_name(kind, key))
        if data is None:
            return None
        return _parse_manifest(data, kind, key)

    def fetch(self, kind: str, key: str, folder: Path) -> dict | None:
        """Pull ``kind/key`` into the empty staging ``folder`` (its files and manifest.json), every
        file checked against its size and sha256. None when the store has no such entry; raises
        ``CorruptObject`` (one line naming entry and object) or ``StoreError``."""
        data = self.store.get(manifest_name(kind, key))
        if data is None:
            return None
        manifest = _parse_manifest(data, kind, key)
        for name, record in sorted(manifest["files"].items()):
            sha, size = record.get("sha256"), record.get("size")
            dest = folder / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            what = f"store entry {kind}/{key[:12]}: object {blob_name(str(sha))} ({name})"
            try:
                got, digest = self.store.get_file(blob_name(sha), dest)  # hashed as it was written
            except FileNotFoundError as cause:
                raise CorruptObject(f"{what} is missing") from cause
            if got != size:
                raise CorruptObject(f"{what} has {got} bytes, {size} recorded (truncated or replaced)")
            if digest != sha:
                raise CorruptObject(f"{what} does not match its sha256 (corrupt)")
        (folder / MANIFEST).write_bytes(data)
        return manifest

    def entries(self, *, manifests: bool = True) -> list[RemoteEntry]:
        rows = []
        for info in self.store.list(ENTRIES):
            parts = info.name[len(ENTRIES):].split("/")
            if len(parts) != 2 or not parts[1].endswith(".json"):
                continue
            rows.append(RemoteEntry(parts[0], parts[1][:-5], info))
        if manifests and rows:
            def read(row: RemoteEntry) -> None:
                data = self.store.get(row.info.name)
                try:
                    row.manifest = _parse_manifest(data, row.kind, row.key) if data is not None else None
                except CorruptObject:
                    row.manifest = None

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(read, rows))
        return rows

    def index_records(self, identity: dict) -> list[dict]:
        prefix = f"{INDEX}{identity_hash(identity)}/"
        records = []
        for info in self.store.list(prefix):
            data = self.store.get(info.name)
            try:
                record = json.loads(data) if data else None
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            if isinstance(record, dict) and record.get("identity") == identity and record.get("key"):
                records.append(record)
        return records

    def all_index_records(self) -> list[dict]:
        out = []
        for info in self.store.list(INDEX):
            data = self.store.get(info.name)
            try:
                record = json.loads(data) if data else None
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    # -- writing ---------------------------------------------------------------------------------
    def publish(self, folder: Path, manifest: dict) -> bool:
        """Push a complete local entry: blobs the store lacks, then the manifest where there is none.
        True when this call published it, False when it was there already."""
        kind, key = manifest["kind"], manifest["key"]
        name = manifest_name(kind, key)
        replace = False
        if self.store.head(name) is not None:
            if self._manifest_readable(name, key):
                return False
            replace = True  # a garbage manifest (a crashed writer, a hand edit): this complete one replaces it
        for file, record in sorted(manifest["files"].items()):
            blob = blob_name(record["sha256"])
            there = self.store.head(blob)
            if there is None or there.size != record["size"]:
                self.store.put_file(blob, folder / file)
        return self.store.put(name, (folder / MANIFEST).read_bytes(), if_absent=not replace)

    def _manifest_readable(self, name: str, key: str) -> bool:
        """Whether the store's manifest ``name`` is one (JSON naming ``key``): what a pull can use."""
        try:
            data = self.store.get(name)
            record = json.loads(data) if data else None
        except (ValueError, UnicodeDecodeError, RecursionError, CorruptObject):
            return False
        return isinstance(record, dict) and record.get("key") == key

    def write_index(self, manifest: dict, verdict: dict | None = None) -> dict | None:
        """The engine's index record (after its manifest): identity, hardware, verdict, provenance."""
        identity = identity_of(manifest)
        if identity is None:
            return None
        name = index_name(identity, manifest["key"])
        old = self.store.get(name)
        try:
            record = json.loads(old) if old else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            record = None  # a garbage record (a crashed writer, a hand edit): written anew from the manifest
        if not isinstance(record, dict) or record.get("key") != manifest["key"]:
            record = {"kind": "engine", "key": manifest["key"], "identity": identity,
                      "hardware": hardware_of(manifest),
                      "verdict": {"parity": (manifest.get("parity") or {}).get("passed")},
                      "provenance": manifest.get("versions") or {},
                      "published": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if verdict:
            record.setdefault("verdict", {}).update(verdict)
        data = json.dumps(record, indent=2, sort_keys=True).encode()
        if data != old:
            self.store.put(name, data)
        return record

    def write_report(self, key: str, report: dict) -> str:
        import hashlib

        data = json.dumps(_finite(report), indent=2, sort_keys=True, allow_nan=False, default=str).encode()
        name = f"{REPORTS}{key}/{hashlib.sha256(data).hexdigest()}.json"
        self.store.put(name, data)
        return name

    # -- removing --------------------------------------------------------------------------------
    def gc(self, max_age_seconds: float | None, max_size_bytes: int | None, *, dry_run: bool = False,
           now: datetime | None = None) -> GcPlan:
        """Remove entries published longer ago than ``max_age_seconds``, then the oldest ones until
        the entries total at most ``max_size_bytes``; then blobs no remaining manifest names (older
        than ``BLOB_GRACE_SECONDS``: a publisher writes them before its manifest)."""
        now = now or datetime.now(timezone.utc)
        rows = self.entries()
        rows.sort(key=lambda r: r.info.modified or now)
        total = sum(r.size for r in rows)
        plan = GcPlan()
        for row in rows:
            age = (now - row.info.modified).total_seconds() if row.info.modified else 0.0
            too_old = max_age_seconds is not None and age > max_age_seconds
            too_big = max_size_bytes is not None and total > max_size_bytes
            if too_old or too_big:
                plan.entries.append(row)
                total -= row.size
        gone = {(r.kind, r.key) for r in plan.entries}
        keep = [r for r in rows if (r.kind, r.key) not in gone]
        plan.kept = len(keep)
        named = {rec.get("sha256") for r in keep for rec in ((r.manifest or {}).get("files") or {}).values()
                 if isinstance(rec, dict)}
        unreadable_kept = any(r.manifest is None for r in keep)
        for blob in self.store.list(BLOBS):
            sha = blob.name.rsplit("/", 1)[-1]
            old = blob.modified is None or (now - blob.modified).total_seconds() > BLOB_GRACE_SECONDS
            if sha not in named and old and not unreadable_kept:
                plan.blobs.append(blob)
        if dry_run:
            return plan
        removed_keys = {r.key for r in plan.entries}
        if removed_keys:
            stale = [i.name for i in self.store.list(INDEX) if i.name.rsplit("/", 1)[-1][:-5] in removed_keys]
            self.store.delete(stale)
            self.store.delete([r.info.name for r in plan.entries])
            reports = [i.name for key in removed_keys for i in self.store.list(f"{REPORTS}{key}/")]
            self.store.delete(reports)
        self.store.delete([b.name for b in plan.blobs])
        return plan


def _disk_full(exc: BaseException) -> bool:
    return is_disk_full(exc)


def _finite(value: Any) -> Any:
    """JSON for strict parsers: NaN and infinities become null."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _parse_manifest(data: bytes, kind: str, key: str) -> dict:
    where = f"store entry {kind}/{key[:12]}: object {manifest_name(kind, key)}"
    try:
        manifest = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as cause:
        raise CorruptObject(f"{where} is not valid JSON (corrupt)") from cause
    if not isinstance(manifest, dict):
        raise CorruptObject(f"{where} is not a JSON object (corrupt)")
    reason = check_manifest(manifest, kind, key)
    if reason is not None:
        raise CorruptObject(f"{where}: {reason}")
    for name, record in manifest["files"].items():
        parts = Path(name).parts
        if (not isinstance(record, dict) or Path(name).is_absolute() or ".." in parts or name == MANIFEST
                or not isinstance(record.get("sha256"), str) or len(record["sha256"]) != 64
                or not isinstance(record.get("size"), int)):
            raise CorruptObject(f"{where} has a bad record for {name!r}")
    return manifest


_REMOTES: dict[RemoteSettings, Remote] = {}
_REMOTES_LOCK = threading.Lock()


def remote_for(settings: RemoteSettings) -> Remote:
    """The process's one ``Remote`` for these settings (its failure state shared by every cache)."""
    with _REMOTES_LOCK:
        if settings not in _REMOTES:
            _REMOTES[settings] = Remote(settings)
        return _REMOTES[settings]
