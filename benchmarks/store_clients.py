"""Measure S3 clients (boto3, obstore, s3fs) on an S3 server: put and get of 50-500 MB objects.

How the store's client was chosen. Runs the clients importable in this interpreter against
``AWS_ENDPOINT_URL`` (credentials from the AWS settings), bucket ``--bucket``:

    python benchmarks/store_clients.py --bucket bench --sizes 50,100,500 --repeat 3 --json out.json

Each figure is the median of ``--repeat`` runs, the clients taking turns (MB/s, 10**6 bytes), files on local disk, the same
part size (16 MiB) and concurrency (8 parts) for every client.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PART = 16 * 2**20
CONCURRENCY = 8


def boto3_client(bucket: str):
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    s3 = boto3.client("s3", config=Config(connect_timeout=5, read_timeout=30,
                                          retries={"max_attempts": 3, "mode": "standard"}))
    cfg = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=CONCURRENCY)

    def put(path: Path, key: str) -> None:
        s3.upload_file(str(path), bucket, key, Config=cfg)

    def get(key: str, dest: Path) -> None:
        s3.download_file(bucket, key, str(dest), Config=cfg)

    return put, get


def obstore_client(bucket: str):
    from datetime import timedelta

    import obstore
    from obstore.store import S3Store

    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    store = S3Store(bucket, endpoint=endpoint, region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                    virtual_hosted_style_request=False,
                    client_options={"allow_http": True, "connect_timeout": "5s", "timeout": "120s"},
                    retry_config={"max_retries": 3, "retry_timeout": timedelta(seconds=60),
                                  "backoff": {"init_backoff": timedelta(milliseconds=100),
                                              "max_backoff": timedelta(seconds=5), "base": 2}})

    def put(path: Path, key: str) -> None:
        obstore.put(store, key, path, chunk_size=PART, max_concurrency=CONCURRENCY)

    def get(key: str, dest: Path) -> None:
        size = obstore.head(store, key)["size"]
        starts = list(range(0, size, PART))
        ends = [min(s + PART, size) for s in starts]
        with open(dest, "wb") as f:
            for i in range(0, len(starts), CONCURRENCY):  # parallel ranged reads, in order
                for buf in obstore.get_ranges(store, key, starts=starts[i:i + CONCURRENCY],
                                              ends=ends[i:i + CONCURRENCY]):
                    f.write(memoryview(buf))

    return put, get


def obstore_stream_client(bucket: str):
    import obstore

    put, _ = obstore_client(bucket)
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=os.environ.get("AWS_ENDPOINT_URL"),
                    region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                    virtual_hosted_style_request=False, client_options={"allow_http": True})

    def get(key: str, dest: Path) -> None:
        with open(dest, "wb") as f:
            for chunk in obstore.get(store, key).stream(min_chunk_size=8 * 2**20):
                f.write(memoryview(chunk))

    return put, get


def s3fs_client(bucket: str):
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=os.environ.get("AWS_ENDPOINT_URL"), default_block_size=PART,
                           max_concurrency=CONCURRENCY, config_kwargs={"connect_timeout": 5, "read_timeout": 30,
                                                                       "retries": {"max_attempts": 3}})

    def put(path: Path, key: str) -> None:
        fs.put_file(str(path), f"{bucket}/{key}", chunksize=PART)

    def get(key: str, dest: Path) -> None:
        fs.get_file(f"{bucket}/{key}", str(dest))

    return put, get


CLIENTS = {"boto3": boto3_client, "obstore": obstore_client, "obstore-stream": obstore_stream_client,
           "s3fs": s3fs_client}


def importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name.split("-")[0]) is not None


def import_seconds(module: str) -> float:
    import subprocess

    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bucket", default="bench")
    ap.add_argument("--sizes", default="50,100,500", help="MB, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size_mb in [int(s) for s in args.sizes.split(",")]:
            src = Path(tmp) / f"src-{size_mb}"
            with open(src, "wb") as f:
                for _ in range(size_mb):
                    f.write(os.urandom(10**6))
            clients = {}
            for name in args.clients.split(","):
                if importable({"s3fs": "s3fs", "boto3": "boto3"}.get(name, "obstore")):
                    clients[name] = CLIENTS[name](args.bucket)
            times = {name: ([], []) for name in clients}
            for r in range(args.repeat):  # clients take turns: a busy machine slows each alike
                for name, (put, get) in clients.items():
                    key = f"bench/{name}-{size_mb}-{r}"
                    t = time.perf_counter()
                    put(src, key)
                    times[name][0].append(time.perf_counter() - t)
                    dest = Path(tmp) / "dest"
                    t = time.perf_counter()
                    get(key, dest)
                    times[name][1].append(time.perf_counter() - t)
                    assert dest.stat().st_size == src.stat().st_size
                    dest.unlink()
            for name, (puts, gets) in times.items():
                row = {"client": name, "size_mb": size_mb, "put_mb_s": round(size_mb / statistics.median(puts), 1),
                       "get_mb_s": round(size_mb / statistics.median(gets), 1),
                       "put_s": [round(x, 2) for x in puts], "get_s": [round(x, 2) for x in gets]}
                rows.append(row)
                print(f"{name:15s} {size_mb:4d} MB  put {row['put_mb_s']:7.1f} MB/s  get {row['get_mb_s']:7.1f} MB/s  "
                      f"(median; put s {row['put_s']}, get s {row['get_s']})", flush=True)
            src.unlink()
    for module in ("boto3", "obstore", "s3fs"):
        if importable(module):
            print(f"import {module}: {import_seconds(module):.2f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
