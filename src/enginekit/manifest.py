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


# -- what each kind of entry records: its readers take these fields as these types ------------------------------
_N = (int, float)  # a number (JSON has no other kind; bools are refused where a number is read)
_D, _L, _S, _B, _0 = dict, list, str, bool, type(None)

#: per kind, the fields beyond the cache's own that readers take from its manifest, and the JSON types they take
#: them as. A stored record whose field is of another type does not parse: it reads as corrupt (one warning, then
#: rebuilt), never as a hit that crashes a reader. A field a kind writes and no reader takes needs no line; a kind
#: missing here is checked for the cache's own fields only.
RECORDS: dict[str, dict[str, tuple[type, ...]]] = {
    "onnx-export": {"weights": (_S,)},
    "onnx-fp16": {"initializer_dtype_share": (_D,), "keep_fp32": (_L,)},
    "onnx-int8": {"calibrated": (_B,), "qdq_nodes": (int,), "exclude": (_L,), "method": (_S,),
                  "calibration_data": (_S,), "calibration_source": (_S,), "qdq_layout": (_S, _0)},
    "onnx-fp8": {"exclude": (_L,)},
    "onnx-int8-repair": {"exclude": (_L,), "repaired_nodes": (_L,), "method": (_S, _0),
                         "calibration_source": (_S, _0)},
    "parity": {"result": (_D,), "passed": (_B, _0)},
    "verdict": {"report": (_D,)},
    "reference": {"cases": (int,), "skipped_images": (_L,), "outputs": (_L,)},
    "ground-truth": {"result": (_D,), "rectangles": _N},
    "repair": {"nodes": (_L,), "result": (_D,)},
    "engine": {"backend": (_S,), "backend_version": (_S,), "targets": (_L,), "gpu": (_D, _0), "profiles": (_L,),
               "precision": (_D,), "versions": (_D,), "parity": (_D,), "model_request": (_D, _0), "chain": (_L,),
               "source_model": (_D, _0), "repair": (_D,)},
    "triton-repo": {"name": (_S,), "platform": (_S,), "verified": (_S,)},
}


def check_record(manifest: dict[str, Any], kind: str) -> str | None:
    """Reason a kind's record (``RECORDS``) does not parse, or None."""
    for name, types in RECORDS.get(kind, {}).items():
        if name not in manifest:
            continue
        value = manifest[name]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            return f"its record's {name} is a {type(value).__name__}, not {' or '.join(t.__name__ for t in types)}"
    return None


def check_manifest(manifest: dict[str, Any], kind: str, key: str) -> str | None:
    """Reason the manifest does not belong to this folder or does not parse as its kind's record, or None."""
    if manifest.get("key") != key:
        return f"{MANIFEST} names key {str(manifest.get('key'))[:10]!r}, not the folder's"
    if manifest.get("kind") != kind:
        return f"{MANIFEST} names kind {manifest.get('kind')!r}, not {kind!r}"
    if not isinstance(manifest.get("files"), dict):
        return f"{MANIFEST} has no file list"
    if not isinstance(manifest.get("parts"), dict):
        return f"{MANIFEST} has no key parts"
    return check_record(manifest, kind)


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

