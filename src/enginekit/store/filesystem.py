"""A store on a shared filesystem path (NFS, a mounted volume): ``file:///srv/enginekit`` or ``/srv/enginekit``.

The same objects as in a bucket, one file each. Writes go to a temporary file and are renamed
into place (a reader never sees half an object); ``put(if_absent=True)`` links the temporary
file to the name, which fails atomically when the name exists.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from enginekit.fsutil import current_umask, open_regular, read_bytes
from enginekit.store.base import ObjectInfo, StoreError
from enginekit.store.settings import folder_of

_TMP_PREFIX = ".incoming-"


class FileStore:
    def __init__(self, url: str):
        self.url = url
        self.root = Path(folder_of(url))

    def _path(self, name: str) -> Path:
        if name.startswith("/") or ".." in name.split("/"):
            raise ValueError(f"bad object name {name!r}")
        return self.root / name

    def get(self, name: str) -> bytes | None:
        try:
            return read_bytes(self._path(name))
        except FileNotFoundError:
            self.check()
            return None
        except OSError as exc:
            raise self._error(exc, f"read {name}") from exc

    def get_file(self, name: str, dest: Path) -> tuple[int, str]:
        """The object into ``dest``, hashed as it is copied: (bytes written, their sha256)."""
        import hashlib

        digest, written = hashlib.sha256(), 0
        try:
            with open_regular(self._path(name)) as src, open(dest, "wb") as out:
                while chunk := src.read(8 * 2**20):
                    out.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
        except FileNotFoundError:
            if not Path(dest).exists() or written == 0:
                self.check()
            raise
        except OSError as exc:
            if exc.filename == str(dest):
                raise  # ours to report (a full disk here), not the store's
            raise self._error(exc, f"read {name}") from exc
        return written, digest.hexdigest()

    def _staged(self, name: str, write) -> Path:
        path = self._path(name)
        self.check()  # the store's folder is made by whoever sets it up, never by a write (a typo publishes nowhere)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~current_umask())
        except OSError as exc:
            raise self._error(exc, f"write {name}") from exc
        return Path(tmp)

    def put(self, name: str, data: bytes, *, if_absent: bool = False) -> bool:
        tmp = self._staged(name, lambda f: f.write(data))
        try:
            if if_absent:
                try:
                    os.link(tmp, self._path(name))
                except FileExistsError:
                    return False
            else:
                os.replace(tmp, self._path(name))
        except OSError as exc:
            raise self._error(exc, f"write {name}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def put_file(self, name: str, src: Path) -> None:
        def copy(f) -> None:
            with open(src, "rb") as s:
                shutil.copyfileobj(s, f, 8 * 2**20)

        tmp = self._staged(name, copy)
        try:
            os.replace(tmp, self._path(name))
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._error(exc, f"write {name}") from exc

    def head(self, name: str) -> ObjectInfo | None:
        try:
            st = self._path(name).stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(name, st.st_size, datetime.fromtimestamp(st.st_mtime, timezone.utc))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.check()
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            for fname in sorted(filenames):
                if fname.startswith(_TMP_PREFIX):
                    continue
                path = Path(dirpath) / fname
                name = path.relative_to(self.root).as_posix()
                if name.startswith(prefix):
                    try:
                        st = path.stat()
                    except FileNotFoundError:
                        continue
                    yield ObjectInfo(name, st.st_size, datetime.fromtimestamp(st.st_mtime, timezone.utc))

    def delete(self, names: list[str]) -> None:
        for name in names:
            try:
                self._path(name).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._error(exc, f"delete {name}") from exc

    def check(self, write: bool = False) -> None:
        if not self.root.is_dir():
            what = "does not exist" if not os.path.lexists(self.root) else "is not a folder"
            raise StoreError(f"the store {self.url}: {self.root} {what} (a team store is a folder made for it: "
                             "create it first)", "no-bucket")
        if write and not os.access(self.root, os.W_OK | os.X_OK):
            raise StoreError(f"the store {self.url}: {self.root} is not writable", "denied")

    def _error(self, exc: OSError, doing: str) -> StoreError:
        fault = "denied" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "error"
        return StoreError(f"the store {self.url}: cannot {doing}: {exc.strerror or exc}", fault)
