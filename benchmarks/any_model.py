"""Any PyTorch model: enginekit's cold export + simplify of a torchvision model against the plain way, and the
ONNX Runtime CPU latency of both graphs.

    .venv/bin/python benchmarks/any_model.py [--model deeplabv3_resnet50] [--size 512] [--runs 5] [--json out.json]

The plain way: torchvision builds the model (seeded random weights, its auxiliary head as its published
weights carry), ``torch.onnx.export`` at 1x3xSxS (dynamic batch, height and width, opset 18), then
onnxsim. enginekit: ``enginekit.api.export("torchvision:NAME", random_init=True)`` in a fresh cache; its
export and simplify stages are timed by the pipeline itself (the graph is traced and proven equal at 64 x 64:
one graph at any size). Each side runs in its own fresh process, as a user meets it. Latency: the median of
``--runs`` runs of each graph at 1x3xSxS on ONNX Runtime's CPU provider, the two graphs alternating.
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

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_CONFIG_DIR", str(Path(tempfile.gettempdir()) / "enginekit-bench-ultralytics"))

PLAIN = """
import sys, time, torch, torchvision, onnx, onnxsim
name, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
kw = {"aux_loss": True, "weights_backbone": None} if name.startswith(("deeplabv3", "fcn")) else {}
model = torchvision.models.get_model(name, weights=None, **kw).eval()
start = time.perf_counter()
with torch.no_grad():
    torch.onnx.export(model, (torch.rand(1, 3, size, size),), out, opset_version=18, input_names=["images"],
                      dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"}}, dynamo=False)
exported = time.perf_counter()
simplified, ok = onnxsim.simplify(onnx.load(out))
assert ok
onnx.save(simplified, out)
done = time.perf_counter()
print(exported - start, done - exported)
"""

ENGINEKIT = """
import sys, json
from pathlib import Path
from enginekit import api
from enginekit.cache import Cache
name, size, out, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
r = api.export(f"torchvision:{name}", random_init=True, input=f"1x3x{size}x{size}", output=Path(out),
               cache=Cache(cache), quiet=True)
seconds = {e.label: e.seconds for e in r.events if e.kind == "stage"}
simplified = next(a for a in r.artifacts if a.stage == "simplify").path  # written out or not
print(json.dumps({"seconds": seconds, "passed": r.passed, "failures": r.failures(), "graph": str(simplified),
                  "task": r.parity[-1].task if r.parity else {}}))
"""


def latency(paths: dict[str, Path], size: int, runs: int) -> dict[str, float]:
    import numpy as np
    import onnxruntime as ort

    sessions = {k: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    x = np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for s in sessions.values():  # warm-up
        s.run(None, {s.get_inputs()[0].name: x})
    for _ in range(runs):
        for k, s in sessions.items():
            start = time.perf_counter()
            s.run(None, {s.get_inputs()[0].name: x})
            times[k].append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="deeplabv3_resnet50")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain_onnx, ek_onnx = root / "plain.onnx", root / "enginekit.onnx"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PLAIN, args.model, str(args.size), str(plain_onnx)],
                              check=True, stdout=subprocess.PIPE, text=True)
        plain_wall = time.perf_counter() - start
        plain_export, plain_simplify = (float(v) for v in done.stdout.split()[-2:])
        print(f"plain: export {plain_export:.2f} s, simplify {plain_simplify:.2f} s, process {plain_wall:.2f} s", flush=True)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", ENGINEKIT, args.model, str(args.size), str(ek_onnx),
                               str(root / "cache")], check=True, stdout=subprocess.PIPE, text=True)
        ek_wall = time.perf_counter() - start
        ek = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(ek), flush=True)
        ek_onnx = Path(ek["graph"])
        ek_export = ek["seconds"].get("export", 0.0)
        ek_simplify = next((v for k, v in ek["seconds"].items() if k.startswith("simplify")), 0.0)
        ms = latency({"plain": plain_onnx, "enginekit": ek_onnx}, args.size, args.runs)
    rows = {
        "model": f"torchvision:{args.model}", "size": args.size,
        "plain_export_s": plain_export, "plain_simplify_s": plain_simplify, "plain_process_s": plain_wall,
        "enginekit_export_s": ek_export, "enginekit_simplify_s": ek_simplify, "enginekit_process_s": ek_wall,
        "enginekit_stages_s": ek["seconds"], "enginekit_passed": ek["passed"], "enginekit_task": ek["task"],
        "export_simplify_ratio": (ek_export + ek_simplify) / (plain_export + plain_simplify),
        "ort_cpu_ms_plain": ms["plain"], "ort_cpu_ms_enginekit": ms["enginekit"],
        "ort_latency_ratio": ms["enginekit"] / ms["plain"],
    }
    for k, v in rows.items():
        print(f"{k:24} {v:.3f}" if isinstance(v, float) else f"{k:24} {v}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
