"""Speed of the team store (`make bench-store`): against a real S3 server on loopback.

    python benchmarks/store.py [--json out/bench-store.json] [--repeat 3] [--skip-cold]

Starts SeaweedFS's ``weed`` on loopback (tests/s3server.py; or uses ``--endpoint``/``--bucket``
with the AWS settings), then measures:

1. yolo12n FP16 (random weights, default profile): building it cold into an empty cache (pushing,
   as CI does), against a remote hit into an empty cache (read-only credentials, read mode), both in
   one process after its imports (goal: the hit >= 50x faster); and the hit as an ``enginekit build``
   command, process start-up included.
2. pull throughput of a 100 MB entry into an empty cache, sha256 checked (goal >= 200 MB/s).
3. ``enginekit.load()`` on an empty cache with a remote hit, after imports (goal <= 3 s). On a
   machine with a GPU: ``load("yolo12n", precision="fp16", backend="tensorrt")``, resolved by identity.
   Without one (no engine can run): the FP16 graph by its cache key on ONNX Runtime's CPU provider.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ["build", "yolo12n", "--random-init", "--precision", "fp16"]


def enginekit(args: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "enginekit", *args], env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"enginekit {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return took, done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-cold", action="store_true", help="skip the cold build (its figure is then missing)")
    ap.add_argument("--endpoint", help="an S3 endpoint to use instead of starting one (AWS settings for the rest)")
    ap.add_argument("--bucket", default="enginekit-tests")
    args = ap.parse_args()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="enginekit-bench-store-"))
    os.environ.setdefault("YOLO_CONFIG_DIR", str(work / "ultralytics"))
    server = None
    if args.endpoint:
        rw = ro = {"AWS_ENDPOINT_URL": args.endpoint}
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from s3server import RO, RW, S3Server

        server = S3Server(work / "s3")
        server.start()
        rw, ro = server.env(RW), server.env(RO)
    url = f"s3://{args.bucket}/bench-{os.getpid()}"
    base = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ENGINEKIT_REMOTE": url}
    report: dict = {"store": url, "machine": f"{os.cpu_count()} cores", "repeat": args.repeat}
    try:
        # 1. in one process, after imports: a cold build into an empty cache (pushing, as CI does), then
        #    remote hits into empty caches (read-only credentials, read mode: found by identity)
        code = f"""
import json, time
from pathlib import Path
import boto3, enginekit.store.s3
from enginekit import api
from enginekit.cache import Cache
from enginekit.store.settings import using
work = Path({str(work)!r})
out = {{}}
if not {args.skip_cold!r}:
    t = time.perf_counter()
    with using({url!r}):
        api.build("yolo12n", random_init=True, precision="fp16", cache=Cache(work / "ci"), quiet=True)
    out["cold"] = time.perf_counter() - t
hits = []
for i in range({args.repeat}):
    t = time.perf_counter()
    with using({url!r}, read_only=True):
        hit = api.build("yolo12n", random_init=True, precision="fp16", cache=Cache(work / f"hit-{{i}}"), quiet=True)
    hits.append(time.perf_counter() - t)
    assert hit.resolution and "found by identity" in hit.resolution, hit.resolution
out["hits"] = hits
print(json.dumps(out))
"""
        if args.skip_cold:  # the store still needs the engine
            enginekit(BUILD, {**base, **rw, "ENGINEKIT_CACHE": str(work / "ci")})
        done = subprocess.run([sys.executable, "-c", code], env={**base, **rw}, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(done.stderr[-3000:])
        found = json.loads(done.stdout.strip().splitlines()[-1])
        hit = statistics.median(found["hits"])
        report["in_process_remote_hit_s"] = [round(h, 3) for h in found["hits"]]
        if "cold" in found:
            report["in_process_cold_build_s"] = round(found["cold"], 2)
            report["cold_over_hit"] = round(found["cold"] / hit, 1)
            print(f"cold build of yolo12n fp16, empty cache (after imports): {found['cold']:8.2f} s", flush=True)
        print(f"remote hit into an empty cache (after imports):         {hit:8.2f} s  (median of "
              f"{[round(h, 2) for h in found['hits']]})", flush=True)
        if "cold_over_hit" in report:
            print(f"  cold / hit: {report['cold_over_hit']:.1f}x (goal >= 50x)", flush=True)
        cli = []
        for i in range(args.repeat):
            took, done = enginekit(BUILD, {**base, **ro, "ENGINEKIT_REMOTE_MODE": "read",
                                           "ENGINEKIT_CACHE": str(work / f"deploy-{i}")})
            assert "found by identity" in done.stderr, done.stderr
            cli.append(took)
        report["cli_remote_hit_s"] = [round(h, 2) for h in cli]
        print(f"the same hit as a command (enginekit build, process start and imports included): "
              f"{statistics.median(cli):.2f} s (runs {[round(h, 2) for h in cli]})", flush=True)

        # 2. pull throughput of a 100 MB entry
        code = f"""
import json, os, sys, time
from pathlib import Path
from enginekit.cache import Cache
from enginekit.store.settings import RemoteSettings
from enginekit.store.tier import Remote
work = Path({str(work)!r})
payload = os.urandom(100 * 10**6)
ci = Cache(work / "big-ci", remote=Remote(RemoteSettings({url!r}, "readwrite", 60)))
entry, _ = ci.get_or_create("onnx-export", {{"bench": "100MB"}}, lambda tmp: (tmp / "model.onnx").write_bytes(payload) and {{}})
reader = Remote(RemoteSettings({url!r}, "read", 60))
reader.store.check()  # the client set up (botocore reads its service model once per process)
out = []
for i in range(max(5, {args.repeat})):  # the first pulls right after the upload meet a server still writing it
    cache = Cache(work / f"big-{{i}}", remote=reader)
    t = time.perf_counter()
    pulled, status = cache.pull("onnx-export", entry.key)
    out.append(time.perf_counter() - t)
    assert status == "pulled" and pulled.file("model.onnx").stat().st_size == len(payload)
print(json.dumps(out))
"""
        done = subprocess.run([sys.executable, "-c", code], env={**base, **rw}, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(done.stderr[-2000:])
        pulls = json.loads(done.stdout.strip().splitlines()[-1])
        rates = [100 / s for s in pulls]
        report["pull_100mb_mb_s"] = [round(r, 1) for r in rates]
        print(f"pull of a 100 MB entry, sha256 checked:             {statistics.median(rates):8.1f} MB/s  "
              f"(runs in order {[round(r) for r in rates]}; goal >= 200)", flush=True)

        # 3. load() with a remote hit on an empty cache, after imports
        fp16_key = json.loads((next((work / "ci" / "engine").iterdir()) / "manifest.json").read_text())["chain"][-1]["key"]
        import shutil
        code = f"""
import json, sys, time
import numpy as np
import enginekit, enginekit.runtime.loader, enginekit.cache, enginekit.store.tier, onnxruntime, boto3
from enginekit.gpu import gpu_info
gpu = gpu_info() is not None
t = time.perf_counter()
if gpu:
    p = enginekit.load("yolo12n", precision="fp16", random_init=True, backend="tensorrt", remote_read_only=True)  # identity
else:
    p = enginekit.load(sys.argv[1], backend="onnxruntime-cpu", remote_read_only=True)
loaded = time.perf_counter() - t
p(np.full((480, 640, 3), 114, np.uint8))
print(json.dumps({{"gpu": gpu, "seconds": loaded, "backend": p.backend, "reason": p.reason}}))
"""
        loads = []
        for i in range(args.repeat):
            import shutil

            cache_dir = work / f"load-{i}"
            shutil.rmtree(cache_dir, ignore_errors=True)
            done = subprocess.run([sys.executable, "-c", code, fp16_key], env={**base, **ro, "ENGINEKIT_REMOTE_MODE": "read",
                                  "ENGINEKIT_CACHE": str(cache_dir)}, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(done.stderr[-2000:])
            loads.append(json.loads(done.stdout.strip().splitlines()[-1]))
        secs = [x["seconds"] for x in loads]
        report["load_s"] = [round(s, 2) for s in secs]
        report["load_backend"] = loads[0]["backend"]
        what = ("load('yolo12n', fp16, tensorrt), identity" if loads[0]["gpu"] else
                "load(FP16 graph key), onnxruntime-cpu (no GPU)")
        print(f"{what}, empty cache: {statistics.median(secs):6.2f} s after imports  "
              f"(runs {[round(s, 2) for s in secs]}; goal <= 3 s)", flush=True)
    finally:
        if server is not None:
            server.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
