"""S3 (AWS S3, MinIO, Ceph, SeaweedFS, GCS's S3 API) through boto3.

Chosen by measurement (benchmarks/store_clients.py; figures in the README's "Team store"):
boto3's transfer manager gave the fastest pulls on 50-500 MB entries, and boto3 reads every
standard AWS setting as every S3 tool does (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and ``~/.aws/config``, the region).

Large files go as multipart uploads and come back as parallel ranged reads (16 MiB parts, 8 at
a time); every request has a connect and read timeout (``ENGINEKIT_REMOTE_TIMEOUT``) and is
retried with exponential backoff (botocore's "standard" mode, 3 attempts).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Iterator

from enginekit.store.base import ObjectInfo, StoreError
from enginekit.errors import UsageError, first_line

PART = 16 * 2**20
CONCURRENCY = 8
ATTEMPTS = 3

# S3 error codes -> (fault, what to say)
_CODES = {
    "NoSuchBucket": ("no-bucket", "the bucket does not exist"),
    "AccessDenied": ("denied", "access denied (these credentials may not do this)"),
    "AllAccessDisabled": ("denied", "access denied"),
    "InvalidAccessKeyId": ("credentials", "the access key is not known to the store"),
    "SignatureDoesNotMatch": ("credentials", "the secret key does not match the access key"),
    "InvalidToken": ("credentials", "the session token is invalid"),
    "ExpiredToken": ("credentials", "the session token has expired"),
    "403": ("denied", "access denied (HTTP 403)"),
}


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix")."""
    match = re.fullmatch(r"s3://([^/]+)/?(.*)", url)
    if not match or not re.fullmatch(r"[a-z0-9][a-z0-9.\-_]{1,62}", match[1]):
        raise UsageError(f"malformed store URL {url!r}: expected s3://BUCKET or s3://BUCKET/PREFIX")
    return match[1], match[2].strip("/")


class S3Store:
    def __init__(self, url: str, *, timeout: float = 10.0):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.url = url
        self.bucket, self.prefix = parse_s3_url(url)
        session = boto3.session.Session()
        config = Config(connect_timeout=timeout, read_timeout=timeout, retries={"mode": "standard",
                        "max_attempts": ATTEMPTS}, max_pool_connections=2 * CONCURRENCY)
        try:
            self.client = session.client("s3", config=config)
        except Exception as exc:  # noqa: BLE001 - a bad profile or region setting: one line
            raise StoreError(f"cannot set up the S3 client for {url}: {_first(exc)}", "credentials") from exc
        self.endpoint = self.client.meta.endpoint_url
        self.transfer = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART,
                                       max_concurrency=CONCURRENCY, use_threads=True)

    # -- names
    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _name(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    # -- operations
    def get(self, name: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            raise self._error(exc, f"read {name}") from exc

    def get_file(self, name: str, dest: Path) -> tuple[int, str]:
        """The object into ``dest``: 16 MiB ranges fetched 8 at a time, written and hashed in order as
        they arrive, so hashing overlaps the transfer. Returns (bytes written, their sha256)."""
        import hashlib
        from concurrent.futures import ThreadPoolExecutor

        key = self._key(name)
        try:
            size = int(self.client.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("NoSuchKey", "404"):
                raise FileNotFoundError(name) from exc
            raise self._error(exc, f"read {name}") from exc
        digest = hashlib.sha256()
        starts = list(range(0, size, PART)) or [0]

        def fetch(start: int) -> bytes:
            ranged = {"Range": f"bytes={start}-{min(start + PART, size) - 1}"} if size else {}
            for attempt in range(ATTEMPTS):  # botocore retries the request; this, a body cut mid-read
                try:
                    return self.client.get_object(Bucket=self.bucket, Key=key, **ranged)["Body"].read()
                except Exception as exc:  # noqa: BLE001
                    if attempt == ATTEMPTS - 1 or _code(exc) or isinstance(exc, StoreError):
                        raise
                    time.sleep(0.2 * 2 ** attempt)
            raise AssertionError("unreachable")

        written = 0
        try:
            with open(dest, "wb") as f, ThreadPoolExecutor(CONCURRENCY) as pool:
                pending = [pool.submit(fetch, s) for s in starts[:CONCURRENCY]]
                for i in range(len(starts)):
                    chunk = pending[i].result()
                    if i + CONCURRENCY < len(starts):
                        pending.append(pool.submit(fetch, starts[i + CONCURRENCY]))
                    pending[i] = None
                    f.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
        except Exception as exc:  # noqa: BLE001
            from botocore.exceptions import BotoCoreError

            if isinstance(exc, OSError) and not isinstance(exc, BotoCoreError) and exc.errno is not None:
                raise  # this machine's disk (full?), not the store
            if _code(exc) in ("NoSuchKey", "404"):
                raise FileNotFoundError(name) from exc
            raise self._error(exc, f"read {name}") from exc
        return written, digest.hexdigest()

    def put(self, name: str, data: bytes, *, if_absent: bool = False) -> bool:
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data, **extra)
        except Exception as exc:  # noqa: BLE001
            if if_absent and _code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                return False
            raise self._error(exc, f"write {name}") from exc
        return True

    def put_file(self, name: str, src: Path) -> None:
        try:
            self.client.upload_file(str(src), self.bucket, self._key(name), Config=self.transfer)
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, f"write {name}") from exc

    def head(self, name: str) -> ObjectInfo | None:
        try:
            meta = self.client.head_object(Bucket=self.bucket, Key=self._key(name))
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            if _code(exc) == "403":  # a HEAD answer has no body: ask once more for the reason
                try:
                    self.client.get_object(Bucket=self.bucket, Key=self._key(name), Range="bytes=0-0")
                except Exception as detailed:  # noqa: BLE001
                    if _code(detailed) not in ("NoSuchKey", "404"):
                        exc = detailed
            raise self._error(exc, f"look up {name}") from exc
        return ObjectInfo(name, int(meta["ContentLength"]), meta.get("LastModified"))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        try:
            for page in pages:
                for obj in page.get("Contents", []):
                    yield ObjectInfo(self._name(obj["Key"]), int(obj["Size"]), obj.get("LastModified"))
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, f"list {prefix or 'the store'}") from exc

    def delete(self, names: list[str]) -> None:
        for start in range(0, len(names), 1000):
            batch = [{"Key": self._key(n)} for n in names[start:start + 1000]]
            try:
                answer = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except Exception as exc:  # noqa: BLE001
                raise self._error(exc, "delete objects") from exc
            errors = answer.get("Errors") or []
            if errors:
                first = errors[0]
                fault, what = _CODES.get(first.get("Code", ""), ("error", first.get("Message", "refused")))
                raise StoreError(f"the store {self.url} refused to delete {first.get('Key')}: {what}", fault)

    def check(self, write: bool = False) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in ("404", "NoSuchBucket"):
                raise StoreError(f"the store {self.url}: the bucket {self.bucket} does not exist", "no-bucket") from exc
            if _code(exc) == "403":  # a HEAD answer has no body: a listing says why
                try:
                    self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(""), MaxKeys=1)
                except Exception as detailed:  # noqa: BLE001
                    exc = detailed
            raise self._error(exc, "reach the bucket") from exc

    # -- errors
    def _error(self, exc: BaseException, doing: str) -> StoreError:
        """One line: which store, what was being done, and the kind of failure."""
        from botocore import exceptions as bx

        where = f"the store {self.url}" + (f" ({self.endpoint})" if self.endpoint else "")
        doing = _short(doing)
        if isinstance(exc, bx.NoCredentialsError):
            return StoreError(f"{where}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or "
                              "AWS_PROFILE)", "credentials")
        if isinstance(exc, (bx.ReadTimeoutError, bx.ConnectTimeoutError)):
            return StoreError(f"{where} did not answer within the timeout while trying to {doing}", "timeout")
        if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectionClosedError, bx.ConnectionError)):
            return StoreError(f"{where} is unreachable: {_first(exc)}", "unreachable")
        code = _code(exc)
        if code in _CODES:
            fault, what = _CODES[code]
            if fault == "no-bucket":
                what = f"the bucket {self.bucket} does not exist"
            return StoreError(f"{where}: cannot {doing}: {what}", fault)
        text = _first(exc)
        if "timed out" in text.lower() or "timeout" in text.lower():
            return StoreError(f"{where} did not answer within the timeout while trying to {doing}", "timeout")
        if "connect" in text.lower():
            return StoreError(f"{where} is unreachable: {text}", "unreachable")
        return StoreError(f"{where}: cannot {doing}: {text}", "error")


def _short(name: str) -> str:
    """An object name for messages: a sha256 or key cut to 12 digits."""
    return re.sub(r"[0-9a-f]{64}", lambda m: m[0][:12], name)


def _code(exc: BaseException) -> str:
    """The S3 error code of a botocore or boto3 transfer error ("" when there is none)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    # boto3's upload/download failures wrap the ClientError's text: "An error occurred (AccessDenied) when ..."
    found = re.search(r"An error occurred \((\w+)\)", str(exc))
    cause = exc.__cause__ or exc.__context__
    if found:
        return found[1]
    return _code(cause) if cause is not None and cause is not exc else ""


def _first(exc: BaseException) -> str:
    return first_line(exc, 200)
