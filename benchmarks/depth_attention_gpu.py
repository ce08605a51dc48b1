"""Depth-Anything-V2-small on ONNX Runtime CUDA: the plain FP16 graph vs its copy with fused attention.

    python benchmarks/depth_attention_gpu.py [--runs 200] [--batches 1,8] [--size 518] [--json out.json]
    python benchmarks/depth_attention_gpu.py --cpu --runs 3 --batches 1 --size 266     # smoke run, no GPU

Network alone, input already in GPU memory: ORT CUDA with I/O binding and ORT's CUDA graph
(enginekit's OrtCudaSession) on
  plain   enginekit's exported FP16 graph (attention as MatMul-Softmax-MatMul),
  plain + ORT optimizer   the plain graph after onnxruntime.transformers' optimizer alone (it
          fuses Gelu and SkipLayerNormalization, not this attention),
  fused   the same graph with each attention block as com.microsoft.MultiHeadAttention and ORT's
          own fusions (enginekit.onnx.attention; what the runtime runs by default for this family),
and PyTorch FP16 + CUDA graph (enginekit's TorchSession) as the anchor. Weights: every layer at
PyTorch's default init (no download), so the depth map varies and agreement figures mean something.
Prints a markdown table: p50 / p95 ms over --runs runs after warm-up, ratio to PyTorch, and each
output's rel L2 against PyTorch's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if (HERE.parent / "src" / "enginekit").is_dir():  # this checkout's enginekit, whatever else is installed
    sys.path.insert(0, str(HERE.parent / "src"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")

from runtime_gpu import depth_weights, pct, rel_l2  # noqa: E402  (benchmarks/runtime_gpu.py)

ROWS: list[dict] = []
NOTES: list[str] = []


def note(text: str) -> None:
    NOTES.append(text)
    print(f"  note: {text}", flush=True)


def timed(fn, runs: int, warmup: int, sync) -> dict:
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return pct(out)


def export_graphs(tmp: Path, size: int) -> tuple[dict[str, Path], Path]:
    """The FP16 graph enginekit exports (through its cache), its fused copy, and that copy optimized."""
    from enginekit import api
    from enginekit.onnx.attention import fused_attention_copy
    from enginekit.flows.load import simplifier as _simplifier

    weights = depth_weights(tmp)
    res = api.export("depth", weights=weights, input=f"1x3x{size}x{size}", output=tmp / "depth16.onnx", fp16=True,
                     quiet=True, simplifier=_simplifier())
    graphs = {"plain": Path(res.output)}
    t0 = time.perf_counter()
    fused, count = fused_attention_copy(graphs["plain"])
    note(f"attention fusion: {count} blocks fused in {time.perf_counter() - t0:.1f}s (or found in the cache)")
    if fused is not None:
        graphs["fused"] = fused
    try:  # ORT's optimizer alone on the plain graph: what it fuses without the attention rewrite
        from onnxruntime.transformers.optimizer import optimize_model

        opt = optimize_model(str(graphs["plain"]), model_type="vit", num_heads=6, hidden_size=384, opt_level=0)
        fusedops = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
        opt.save_model_to_file(str(tmp / "depth16-opt.onnx"))
        graphs["plain + ORT optimizer"] = tmp / "depth16-opt.onnx"
        note(f"ORT transformer optimizer on the plain graph: {fusedops}")
    except Exception as exc:  # noqa: BLE001
        note(f"ORT transformer optimizer on the plain graph failed: {type(exc).__name__}: {str(exc)[:160]}")
    return graphs, weights


def count_ops(path: Path) -> str:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    ops: dict[str, int] = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    keys = ("MultiHeadAttention", "Softmax", "MatMul", "Cast", "Transpose")
    return f"{len(m.graph.node)} nodes; " + ", ".join(f"{k} {ops.get(k, 0)}" for k in keys)


def run_gpu(graphs, weights, batches, size, runs, warmup) -> None:
    import torch

    from enginekit.families import resolve
    from enginekit.backends import Artifact
    from enginekit.backends.ort import OnnxRuntimeCuda
    from enginekit.backends.pytorch import Torch

    adapter = resolve("depth")
    loaded = adapter.load(weights, random_init=False, seed=0)
    sync = torch.cuda.synchronize
    for batch in batches:
        x = torch.rand((batch, 3, size, size), device="cuda", generator=torch.Generator("cuda").manual_seed(batch))
        module = Artifact.of_module(loaded.module, adapter.input_name, adapter.output_names, (None, 3, size, size))
        t = Torch.open(module, device="cuda:0", precision="fp16")
        ref = t(x)["depth"].clone()
        stats = timed(lambda: t(x), runs, warmup, sync)
        add_row(batch, "PyTorch fp16 + CUDA graph", stats, stats["p50"], 0.0)
        anchor = stats["p50"]
        del t
        for label, path in graphs.items():
            try:
                s = OnnxRuntimeCuda.open(Path(path), device="cuda:0", cuda_graph=True)

                def net(s=s):
                    with torch.cuda.stream(s.stream):
                        return s(x)

                out = net()["depth"]
                sync()
                agree = rel_l2(out.float().cpu().numpy(), ref.cpu().numpy())
                stats = timed(net, runs, warmup, sync)
                add_row(batch, f"ORT CUDA {label}" + ("" if s.cuda_graph else " (no CUDA graph: capture refused)"),
                        stats, anchor, agree)
                del s
            except Exception as exc:  # noqa: BLE001
                note(f"{label} batch {batch}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                traceback.print_exc(limit=3)


def run_cpu(graphs, weights, batches, size, runs, warmup) -> None:
    import torch

    from enginekit.families import resolve
    from enginekit.backends.ort import OnnxRuntimeCpu

    adapter = resolve("depth")
    loaded = adapter.load(weights, random_init=False, seed=0)
    module = loaded.module.eval()
    for batch in batches:
        x = np.random.default_rng(batch).random((batch, 3, size, size), dtype=np.float32)
        with torch.inference_mode():
            fn = lambda: module(torch.from_numpy(x))  # noqa: E731
            ref = fn()
            ref = (ref[0] if isinstance(ref, (tuple, list)) else ref).numpy()
            stats = timed(fn, runs, warmup, lambda: None)
        add_row(batch, "PyTorch fp32 (CPU)", stats, stats["p50"], 0.0)
        anchor = stats["p50"]
        for label, path in graphs.items():
            try:
                s = OnnxRuntimeCpu.open(Path(path))
                out = s(x)["depth"]
                stats = timed(lambda: s(x), runs, warmup, lambda: None)
                add_row(batch, f"ORT CPU {label}", stats, anchor, rel_l2(out, ref))
            except Exception as exc:  # noqa: BLE001
                note(f"{label} batch {batch}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def add_row(batch: int, what: str, stats: dict, anchor: float, agree: float) -> None:
    r = {"batch": batch, "what": what, "p50": round(stats["p50"], 3), "p95": round(stats["p95"], 3),
         "over_torch": round(stats["p50"] / anchor, 3), "rel_l2_vs_torch": agree}
    ROWS.append(r)
    print(f"  b{batch} {what:<48} p50 {r['p50']:8.2f} ms  p95 {r['p95']:8.2f}  x{r['over_torch']:.2f}  "
          f"rel L2 {agree:.1e}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--size", type=int, default=518, help="square input side (a multiple of 14)")
    ap.add_argument("--cpu", action="store_true", help="smoke run on the CPU (ONNX Runtime CPU, PyTorch FP32)")
    ap.add_argument("--json")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="enginekit-attn-bench-"))
    import onnxruntime as ort
    import torch

    card = "CPU" if args.cpu else torch.cuda.get_device_name(0)
    print(f"== {card}; torch {torch.__version__}; onnxruntime {ort.__version__}", flush=True)
    graphs, weights = export_graphs(tmp, args.size)
    for label, path in graphs.items():
        note(f"{label}: {count_ops(path)}")
    (run_cpu if args.cpu else run_gpu)(graphs, weights, batches, args.size, args.runs, args.warmup)
    print(f"\n## Depth-Anything-V2-small FP16 {args.size}x{args.size}, network alone, on {card} "
          f"(ms, p50 / p95 over {args.runs} runs)")
    print("| batch | what | p50 | p95 | x PyTorch | rel L2 vs PyTorch |\n|---|---|---|---|---|---|")
    for r in ROWS:
        print(f"| {r['batch']} | {r['what']} | {r['p50']:.2f} | {r['p95']:.2f} | {r['over_torch']:.2f} | "
              f"{r['rel_l2_vs_torch']:.1e} |")
    print("\n" + "\n".join(f"- {n}" for n in NOTES))
    if args.json:
        Path(args.json).write_text(json.dumps({"card": card, "rows": ROWS, "notes": NOTES}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
