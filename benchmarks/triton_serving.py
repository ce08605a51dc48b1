"""A Triton repository written by ``enginekit deploy triton``, served by a real Triton, timed as clients use it.

    .venv/bin/python benchmarks/triton_serving.py [--requests 96] [--clients 8] [--out DIR]

The suite's trained detector (yolov8n on generated shapes, ``tests/trained_detector.py``; trained here if
not cached) deployed twice with ``--platform python`` (the network on ONNX Runtime CPU through enginekit's
runtime inside Triton's Python backend: the server nvidia-pytriton ships has no TensorRT or ONNX Runtime
backend): ``--max-batch 8`` (dynamic batching) and ``--max-batch 1`` (none). Clients send 640x360 frames
(ENCODED PNG files: decoding is the model's work), each request's answer checked against the first one's.

Rows: one client at a time (batching has nothing to gather), then ``--clients`` concurrent clients with and
without dynamic batching: requests/s, p50/p95 latency per request, and the server's batch statistics of the
network (``/v2/models/NAME-net/stats``: executions per batch size).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import trained_detector as td  # noqa: E402  (the suite's detector, drawing and cache)
from triton_server import Server  # noqa: E402  (the suite's server harness)


def frames(folder: Path, count: int = 8) -> list[bytes]:
    import cv2

    rng = np.random.default_rng(7)
    out = []
    for i in range(count):
        img, _ = td.draw_image(rng, 360, 640, (4, 8), td.DATA["side_px"])
        path = folder / f"frame_{i}.png"
        cv2.imwrite(str(path), img[..., ::-1])
        out.append(path.read_bytes())
    return out


def ask(client, model: str, data: bytes) -> dict:
    import tritonclient.http as http

    array = np.frombuffer(data, np.uint8)[None]
    tensor = http.InferInput("ENCODED", array.shape, "UINT8")
    tensor.set_data_from_numpy(array)
    return json.loads(client.infer(model, [tensor]).as_numpy("RESULT")[0].tobytes())


def run(server, model: str, images: list[bytes], requests: int, clients: int, expected: dict) -> dict:
    import tritonclient.http as http

    per_client = requests // clients
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client_loop(k: int) -> None:
        client = http.InferenceServerClient(server.url, network_timeout=600)
        for i in range(per_client):
            index = (k + i) % len(images)
            t0 = time.perf_counter()
            try:
                answer = ask(client, model, images[index])
            except Exception as exc:  # noqa: BLE001 - counted and shown
                errors.append(str(exc))
                continue
            dt = time.perf_counter() - t0
            if [d["class_id"] for d in answer["detections"]] != expected[index]:
                errors.append(f"frame {index}: another answer than the first")
            with lock:
                latencies.append(dt * 1e3)

    before = stats(server, f"{model}-net")
    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = stats(server, f"{model}-net")
    batches = {b: after.get(b, 0) - before.get(b, 0) for b in after if after.get(b, 0) - before.get(b, 0)}
    lat = sorted(latencies)
    return {"clients": clients, "requests": len(lat), "errors": errors[:3], "error_count": len(errors),
            "req_per_s": round(len(lat) / wall, 2), "p50_ms": round(statistics.median(lat), 1),
            "p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 1), "net_batches": dict(sorted(batches.items()))}


def stats(server, model: str) -> dict[int, int]:
    import tritonclient.http as http

    s = http.InferenceServerClient(server.url).get_inference_statistics(model)["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in s.get("batch_stats", [])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from enginekit import api

    detector = td.trained_detector()
    work = Path(args.out or tempfile.mkdtemp(prefix="triton-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "models"
    for name, batch in (("batched", 8), ("single", 1)):
        api.deploy("yolov8n", repo=repo, weights=detector.weights, name=name, platform="python", max_batch=batch,
                   quiet=True)
    images = frames(work)
    rows = []
    with Server(repo, work) as server:
        import tritonclient.http as http

        client = http.InferenceServerClient(server.url, network_timeout=600)
        expected = {i: [d["class_id"] for d in ask(client, "batched", img)["detections"]] for i, img in enumerate(images)}
        for model in ("batched", "single"):  # warm: each model's first requests
            for img in images:
                ask(client, model, img)
        print(f"{len(images)} frames 640x360, detections per frame: {[len(v) for v in expected.values()]}",
              file=sys.stderr)
        for label, model, clients in (("one client at a time", "batched", 1),
                                      (f"{args.clients} clients, dynamic batching (max 8)", "batched", args.clients),
                                      (f"{args.clients} clients, no batching (max 1)", "single", args.clients)):
            row = run(server, model, images, args.requests, clients, expected)
            row["setting"] = label
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print("| setting | requests | req/s | p50 ms | p95 ms | network executions by batch size | errors |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['requests']} | {r['req_per_s']} | {r['p50_ms']} | {r['p95_ms']} | "
              f"{r['net_batches']} | {r['error_count']} |")


if __name__ == "__main__":
    main()
