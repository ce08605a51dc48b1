"""Keys and file hashes: what every cached result is named by.

``key_for`` names a result by everything that determines it (canonical JSON, sha256); ``sha256_file``
names a file by its bytes. The bottom of the package: the standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from enginekit.fsutil import open_regular


def canonical(value: Any) -> str:
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
    return hashlib.sha256(canonical(parts).encode("utf-8")).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 hex of a file's bytes (streamed: engines and ONNX files are large)."""
    with open_regular(path) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
