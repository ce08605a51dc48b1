"""The one interface every object store offers the remote tier, and its errors.

A store holds named objects (``blobs/sha256/ab/ab12...``, ``entries/engine/<key>.json``) under
the URL's prefix. The tier (``enginekit.store.tier``) needs only these operations:

    get(name) -> bytes | None          a small object, None when there is none
    get_file(name, dest) -> (n, sha)   a large object into a local file, hashed as written
    put(name, data, if_absent=False)   a small object in one request; with ``if_absent`` the
                                       write happens only when no object has that name (atomic
                                       on the server) and says whether it did
    put_file(name, src)                a large object (multipart, parallel parts)
    head(name) -> ObjectInfo | None
    list(prefix) -> iterator of ObjectInfo
    delete(names)
    check(write=False)                 reachable, the bucket exists, the credentials are accepted

A new kind of store (GCS, Azure) is one module implementing these and one line in
``enginekit.store.open_store``. Failures raise ``StoreError`` with a one-line message and a
``fault`` naming the kind of failure (unreachable, timeout, denied, credentials, no-bucket).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterator, Protocol

from enginekit.errors import CapabilityError


@dataclass(frozen=True)
class ObjectInfo:
    name: str  # relative to the store's prefix
    size: int
    modified: datetime | None = None


class StoreError(CapabilityError):
    """The store cannot do what was asked: one line saying why (exit 3 where a verb asked for it).

    ``fault``: "unreachable", "timeout", "denied", "credentials", "no-bucket" or "error".
    Read-through and write-back never fail a build on it: they warn once and go on locally.
    """

    def __init__(self, message: str, fault: str = "error"):
        super().__init__(message)
        self.fault = fault


class ObjectStore(Protocol):
    url: str

    def get(self, name: str) -> bytes | None: ...

    def get_file(self, name: str, dest: Path) -> tuple[int, str]: ...

    def put(self, name: str, data: bytes, *, if_absent: bool = False) -> bool: ...

    def put_file(self, name: str, src: Path) -> None: ...

    def head(self, name: str) -> ObjectInfo | None: ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]: ...

    def delete(self, names: list[str]) -> None: ...

    def check(self, write: bool = False) -> None: ...
