"""Any PyTorch model: enginekit's cold export + simplify of a torchvision model against the plain way, and the
ONNX Runtime CPU latency of both graphs.

    .venv/bin/python benchmarks/any_model.py [--model deeplabv3_resnet50] [--size 512] [--runs 5] [--json out.json]

The plain way: torchvision builds the model (seeded random weights, its auxiliary head as its published
weights carry), ``torch.onnx.export`` at 1x3xSxS (dynamic batch, height and width, opset 18), then
onnxsim; building the model is outside its timing, and so is enginekit's (its load stage, which runs inside the
export stage on a cache miss, is taken out of the export's time). enginekit: ``enginekit.api.export("torchvision:NAME", random_init=True)`` in a fresh cache; its
export and simplify stages are timed by the pipeline itself (the graph is traced and proven equal at 64 x 64:
one graph at any size). Each side runs in its own fresh process, as a user meets it. Times are given as wall
seconds and as CPU seconds (user + system of the process, all its threads: on a machine shared with other jobs
the wall clock moves with the load, CPU seconds much less). enginekit's stage times include its cache's
bookkeeping (hashing the files, fsync). Latency: the median of ``--runs`` runs of each graph at 1x3xSxS on
ONNX Runtime's CPU provider, the two graphs alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
start, cpu0 = time.perf_counter(), time.process_time()
with torch.no_grad():
    torch.onnx.export(model, (torch.rand(1, 3, size, size),), out, opset_version=18, input_names=["images"],
                      dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"}}, dynamo=False)
exported, cpu1 = time.perf_counter(), time.process_time()
simplified, ok = onnxsim.simplify(onnx.load(out))
assert ok
onnx.save(simplified, out)
done, cpu2 = time.perf_counter(), time.process_time()
print(exported - start, done - exported, cpu1 - cpu0, cpu2 - cpu1)
"""

ENGINEKIT = """
import sys, json, time
from pathlib import Path
from enginekit import api
from enginekit.cache import Cache
from enginekit.pipeline import Stages
name, size, out, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
cpu = {}
stage = Stages.stage
def timed_stage(self, name, parts, produce, label):  # CPU seconds of each cached stage, bookkeeping included
    start = time.process_time()
    try:
        return stage(self, name, parts, produce, label)
    finally:
        cpu[label] = time.process_time() - start
Stages.stage = timed_stage
from enginekit.families.torch_models.family import TorchModelAdapter
load = TorchModelAdapter.load
def timed_load(self, *args, **kwargs):  # the model is built inside the export stage, on its cache miss
    start = time.process_time()
    try:
        return load(self, *args, **kwargs)
    finally:
        cpu["load"] = time.process_time() - start
TorchModelAdapter.load = timed_load
r = api.export(f"torchvision:{name}", random_init=True, input=f"1x3x{size}x{size}", output=Path(out),
               cache=Cache(cache), quiet=True)
seconds = {e.label: e.seconds for e in r.events if e.kind == "stage"}
simplified = next(a for a in r.artifacts if a.stage == "simplify").path  # written out or not
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "passed": r.passed, "failures": r.failures(), "graph": str(simplified),
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


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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
        loads = [os.getloadavg()[0]]
        start, children = time.perf_counter(), _children_cpu()
        done = subprocess.run([sys.executable, "-c", PLAIN, args.model, str(args.size), str(plain_onnx)],
                              check=True, stdout=subprocess.PIPE, text=True)
        plain_wall, plain_cpu = time.perf_counter() - start, _children_cpu() - children
        plain_export, plain_simplify, plain_export_cpu, plain_simplify_cpu = (float(v) for v in done.stdout.split()[-4:])
        print(f"plain: export {plain_export:.2f} s ({plain_export_cpu:.2f} s CPU), simplify {plain_simplify:.2f} s "
              f"({plain_simplify_cpu:.2f} s CPU), process {plain_wall:.2f} s ({plain_cpu:.2f} s CPU)", flush=True)
        loads.append(os.getloadavg()[0])
        start, children = time.perf_counter(), _children_cpu()
        done = subprocess.run([sys.executable, "-c", ENGINEKIT, args.model, str(args.size), str(ek_onnx),
                               str(root / "cache")], check=True, stdout=subprocess.PIPE, text=True)
        ek_wall, ek_cpu = time.perf_counter() - start, _children_cpu() - children
        loads.append(os.getloadavg()[0])
        ek = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(ek), flush=True)
        ek_onnx = Path(ek["graph"])
        # the model is built (and its random weights made informative) inside the export stage, where the
        # export misses the cache: that is the plain way's model building, outside its timing
        ek_load = next((v for k, v in ek["seconds"].items() if k.startswith("load")), 0.0)
        ek_export = ek["seconds"].get("export", 0.0) - ek_load
        ek_simplify = next((v for k, v in ek["seconds"].items() if k.startswith("simplify")), 0.0)
        ek_export_cpu = ek["cpu_seconds"].get("export", 0.0) - ek["cpu_seconds"].get("load", 0.0)
        ek_simplify_cpu = next((v for k, v in ek["cpu_seconds"].items() if k.startswith("simplify")), 0.0)
        ms = latency({"plain": plain_onnx, "enginekit": ek_onnx}, args.size, args.runs)
        loads.append(os.getloadavg()[0])
    rows = {
        "model": f"torchvision:{args.model}", "size": args.size,
        "plain_export_s": plain_export, "plain_simplify_s": plain_simplify, "plain_process_s": plain_wall,
        "plain_export_cpu_s": plain_export_cpu, "plain_simplify_cpu_s": plain_simplify_cpu, "plain_process_cpu_s": plain_cpu,
        "enginekit_export_s": ek_export, "enginekit_simplify_s": ek_simplify, "enginekit_process_s": ek_wall,
        "enginekit_export_cpu_s": ek_export_cpu, "enginekit_simplify_cpu_s": ek_simplify_cpu,
        "enginekit_process_cpu_s": ek_cpu,
        "enginekit_stages_s": ek["seconds"], "enginekit_passed": ek["passed"], "enginekit_task": ek["task"],
        "export_simplify_ratio": (ek_export + ek_simplify) / (plain_export + plain_simplify),
        "export_simplify_cpu_ratio": (ek_export_cpu + ek_simplify_cpu) / (plain_export_cpu + plain_simplify_cpu),
        "load_average_1min": loads,
        "ort_cpu_ms_plain": ms["plain"], "ort_cpu_ms_enginekit": ms["enginekit"],
        "ort_latency_ratio": ms["enginekit"] / ms["plain"],
    }
    for k, v in rows.items():
        print(f"{k:24} {v:.3f}" if isinstance(v, float) else f"{k:24} {v}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
