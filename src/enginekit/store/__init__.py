"""The team store: a remote tier (S3 or a shared folder) under the local cache.

    settings.py    which store and mode: ENGINEKIT_REMOTE, ENGINEKIT_REMOTE_MODE, --remote flags
    base.py        the interface every store implements (get/put/head/list/delete/check) and its errors
    s3.py          S3-compatible stores through boto3 (multipart, parallel parts, retries, timeouts)
    filesystem.py  a shared folder (NFS, a mounted volume)
    tier.py        the layout in the store, pull (sha256-checked), publish (manifest last), gc
    identity.py    deploy by identity: model, weights, precision, profiles + GPU and TensorRT version

``enginekit.cache.Cache`` reads through it (local -> store -> build) and writes back what it
builds; engines are published by the build flow once their gates passed.
"""

from enginekit.store.base import ObjectInfo, ObjectStore, StoreError
from enginekit.store.settings import RemoteSettings, current, using

__all__ = ["ObjectInfo", "ObjectStore", "StoreError", "RemoteSettings", "current", "using"]
