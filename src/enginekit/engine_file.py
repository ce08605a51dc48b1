"""Engine files with Ultralytics' header: a 4-byte little-endian length, that many bytes of JSON metadata, then the
TensorRT plan (what ``YOLO.export(format="engine")`` writes and ``YOLO("model.engine")``'s AutoBackend reads).

enginekit's own engines are bare plans (``engine.plan``: trtexec, C++ loaders and Triton read them); this module
reads a file that has the header (the plan after it) and writes one on request (``build --ultralytics-metadata``).
A plan starts with TensorRT's own magic (``ftrt``; TensorRT-RTX: ``vtrt``), which no header length is: a file that
starts otherwise is read as a header, and a header that is cut short, is no JSON object, or claims more bytes than
the file has is one ``UsageError``, never a plan handed to TensorRT.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from enginekit.errors import UsageError
from enginekit.fsutil import atomic_write, open_regular

#: the first bytes of a serialized plan: TensorRT 10/11, TensorRT-RTX
PLAN_MAGICS = (b"ftrt", b"vtrt")
MAX_HEADER = 16 * 2**20  # Ultralytics' headers are a few kB


def read_header(path: str | os.PathLike[str]) -> tuple[int, dict | None]:
    """(where the plan starts, the header's metadata) of an engine file; (0, None) for a bare plan."""
    path = Path(path)
    with open_regular(path, what="engine file") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(4)
        if len(head) < 4:
            raise UsageError(f"{path.name} is {size} bytes: no TensorRT plan")
        if head in PLAN_MAGICS:
            return 0, None
        length = int.from_bytes(head, "little", signed=True)
        if length <= 0 or length > min(size - 4, MAX_HEADER):
            raise UsageError(f"{path.name}: its header says {length} bytes of metadata, the file holds {size - 4} after "
                             "the length: neither a TensorRT plan nor an Ultralytics engine file (cut short?)")
        text = f.read(length)
        try:
            metadata = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as cause:
            raise UsageError(f"{path.name}: its {length}-byte header is not JSON metadata (a damaged Ultralytics "
                             "engine file?)") from cause
        if not isinstance(metadata, dict):
            raise UsageError(f"{path.name}: its header is JSON but not an object of metadata")
        magic = f.read(4)
        if magic not in PLAN_MAGICS:
            raise UsageError(f"{path.name}: no TensorRT plan follows its {length}-byte header"
                             + (" (the file ends there)" if not magic else ""))
        return 4 + length, metadata


def plan_bytes(path: str | os.PathLike[str]) -> bytes:
    """The plan of an engine file, with or without a header."""
    offset, _ = read_header(path)
    with open_regular(path, what="engine file") as f:
        f.seek(offset)
        return f.read()


def write_with_header(plan: str | os.PathLike[str], dest: str | os.PathLike[str], metadata: dict) -> Path:
    """``dest``: Ultralytics' layout (length, JSON ``metadata``, then ``plan``'s bytes as they are), whole or not at
    all."""
    text = json.dumps(metadata).encode("utf-8")
    with open_regular(plan, what="engine plan") as src, atomic_write(dest, "wb") as out:
        out.write(len(text).to_bytes(4, byteorder="little", signed=True))
        out.write(text)
        while chunk := src.read(8 * 2**20):
            out.write(chunk)
    return Path(dest)
