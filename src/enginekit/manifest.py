"""The manifest: the file that describes one cached entry, shared by the local cache and the team store.

``manifest.json`` in an entry's folder (and, byte for byte, ``entries/<kind>/<key>.json`` in the store)
holds the entry's kind, key, subject, the parts its key was made of, and every file's size and sha256.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from enginekit.fsutil import json_text, read_text
from enginekit.hashing import sha256_file

MANIFEST = "manifest.json"
MANIFEST_LIMIT = 16 * 2**20  # a manifest is a few kB; a larger one is not one (and is not read whole)
# Manifest fields the cache owns; a producer's extra fields may not overwrite them.
RESERVED_FIELDS = ("kind", "key", "parts", "files", "created", "subject")

KEY_RE = re.compile(r"^[0-9a-f]{64}$")
KIND_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_kind_key(kind: str, key: str) -> None:
    # Both become path components: refuse anything that could leave the root.
    if not KIND_RE.match(kind):
        raise ValueError(f"bad cache kind {kind!r}")
    if not KEY_RE.match(key):
        raise ValueError(f"bad cache key {key!r}: expected 64 hex digits")


def read_manifest(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, None) or (None, reason)."""
    try:
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


def check_manifest(manifest: dict[str, Any], kind: str, key: str) -> str | None:
    """Reason the manifest does not belong to this folder, or None."""
    if manifest.get("key") != key:
        return f"{MANIFEST} names key {str(manifest.get('key'))[:10]!r}, not the folder's"
    if manifest.get("kind") != kind:
        return f"{MANIFEST} names kind {manifest.get('kind')!r}, not {kind!r}"
    if not isinstance(manifest.get("files"), dict):
        return f"{MANIFEST} has no file list"
    return None


def verify_files(path: Path, files: dict[str, Any], *, hash: bool = True) -> str | None:
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


def make_manifest(
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json_text(data, indent=2, ensure_ascii=False) + "\n")  # strict JSON: NaN is null

