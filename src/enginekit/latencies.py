"""What ``bench`` measured on this machine, kept in the cache for others to quote (``verify --data``'s ladder).

One JSON file per device under ``<cache>/.bench-records/``: per artifact identity (``onnx:<sha256>`` of a
graph, ``engine:<key>`` of an engine) and backend, the latest network-only p50 in milliseconds at each batch
size. Nothing is estimated: an artifact bench never ran here has no record, and its ladder row no latency.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from enginekit.fsutil import read_text

FOLDER = ".bench-records"  # beside the entries, never one of them (cache ls and gc pass over dot folders)


def _file(cache, device: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", device or "cpu").strip("_") or "cpu"
    return Path(cache.root) / FOLDER / f"{name}.json"


def record(cache, device: str, identity: str, backend: str, batch: int, p50_ms: float) -> None:
    """Keep one measurement (the latest wins); written by a rename, so a reader never sees half a file."""
    path = _file(cache, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read(path)
    data.setdefault(identity, {}).setdefault(backend, {})[str(batch)] = {"p50_ms": round(float(p50_ms), 4),
                                                                      "at": int(time.time())}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def _read(path: Path) -> dict:
    try:
        data = json.loads(read_text(path))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def latency_of(identity: str, cache, batch: int = 1) -> dict | None:
    """The fastest backend's p50 at ``batch`` for ``identity`` on any device of this machine's records:
    {"p50_ms", "backend", "device"}; None where bench never ran it here."""
    if cache is None:
        return None
    folder = Path(cache.root) / FOLDER
    best = None
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        for backend, per_batch in (_read(path).get(identity) or {}).items():
            found = per_batch.get(str(batch))
            if found and (best is None or found["p50_ms"] < best["p50_ms"]):
                best = {"p50_ms": found["p50_ms"], "backend": backend, "device": path.stem}
    return best
