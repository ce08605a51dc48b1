"""enginekit's runtime on a GPU: agreement between backends, and what a user feels per frame.

    python benchmarks/runtime_gpu.py [--fp16-onnx yolo12n.fp16.onnx] [--depth-fp16-onnx d.fp16.onnx]
                                     [--trained best.pt] [--iters 200] [--json out.json] [--only a,b]
    python benchmarks/runtime_gpu.py --only yolo --repeat 3 --trained best.pt --trained-onnx best.onnx \
        --trained-fp16-onnx best.fp16.onnx --frame frame.png     # the ratio against Ultralytics, median of 3

Sections (each one independent: a failure is printed and the rest still run):
  env        GPU, versions, which ONNX Runtime providers load, whether TensorRT runs here
  agree      ORT CUDA vs PyTorch CUDA on the same inputs (yolo12n, Depth-Anything-V2-small, trained detector)
  yolo       yolo12n per frame from a decoded 1080x810 photograph in host memory: enginekit vs Ultralytics
             (with --trained-onnx: the trained detector, its graphs and .pt, on --frame); with --repeat N the
             section runs N times in this process and each run's ratio (enginekit's best p50 / Ultralytics'
             best p50) is printed with their median
  net        network alone vs end to end with the frame already in GPU memory
  fp16       why an FP16 graph can be slower than FP32 on ORT CUDA (layout, casts, CUDA graph)
  depth      Depth-Anything-V2-small per frame
  pipeline   yolo12n + depth on each frame, concurrently on two CUDA streams, vs the slower alone
  depth8     Depth-Anything-V2-small at batch 8
  nms        a --nms graph of the trained detector (--trained) on ORT CUDA: kept boxes and time per frame
Latencies are milliseconds: p50 / p95 / p99 over --iters runs after warm-up.
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

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")
os.environ.setdefault("YOLO_VERBOSE", "False")

ROWS: list[dict] = []
NOTES: list[str] = []


def pct(samples: list[float]) -> dict:
    a = np.asarray(samples)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)), "p99": float(np.percentile(a, 99)),
            "fps": float(1000.0 / a.mean())}


def timed(fn, iters: int, warmup: int = 20) -> dict:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return pct(out)


def timed_sync(fn, iters: int, warmup: int = 20) -> dict:
    """fn queues GPU work; each sample waits for the device."""
    import torch

    def run():
        fn()
        torch.cuda.synchronize()

    return timed(run, iters, warmup)


def row(section: str, what: str, stats: dict, **extra) -> None:
    r = {"section": section, "what": what, **{k: round(v, 3) for k, v in stats.items()}, **extra}
    ROWS.append(r)
    print(f"  {section:<9} {what:<58} p50 {r['p50']:7.2f}  p95 {r['p95']:7.2f}  p99 {r['p99']:7.2f}", flush=True)


def note(text: str) -> None:
    NOTES.append(text)
    print(f"  note: {text}", flush=True)


FRAME: list[Path] = []  # --frame: the frame section yolo times (default: bus.jpg)


def photo() -> tuple[np.ndarray, Path]:
    import cv2

    from enginekit.images import embedded_image_paths

    path = FRAME[0] if FRAME else next(p for p in embedded_image_paths() if p.name == "bus.jpg")
    return cv2.imread(str(path)), path


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(br - tl, 0, None).prod(-1)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None] - inter + 1e-9)


def match_detections(a, b) -> str:
    if len(a) == 0 and len(b) == 0:
        return "both empty"
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} detections"
    iou = box_iou(a.boxes, b.boxes)
    j = iou.argmax(1)
    same = (a.class_ids == b.class_ids[j]).mean()
    return (f"{len(a)} detections, min IoU {iou.max(1).min():.4f}, same class {same:.0%}, "
            f"max score diff {np.abs(a.scores - b.scores[j]).max():.2e}")


# -- sections ---------------------------------------------------------------------------------------------
def section_env(ctx) -> None:
    import onnxruntime as ort
    import torch

    from enginekit.backends.providers import onnxruntime_providers
    from enginekit.trt.session import engine_runs_here

    name = torch.cuda.get_device_name(0)
    ctx["card"] = name
    print(f"  GPU: {name} (cc {'.'.join(map(str, torch.cuda.get_device_capability(0)))}); torch {torch.__version__}; "
          f"onnxruntime {ort.__version__}", flush=True)
    for p in onnxruntime_providers():
        note(f"ORT provider {p.name}: loads={p.loads} ({p.detail})")
    verdict = engine_runs_here()
    ok, why = verdict.ok, verdict.reason
    note(f"TensorRT path: {'runs' if ok else 'does not run'} here: {why}")


def _models(ctx):
    """Random-weight yolo12n (also saved as an Ultralytics checkpoint) and its FP32 ONNX."""
    if "yolo_pt" in ctx:
        return
    from enginekit import api
    from enginekit.families import resolve
    from enginekit.flows.load import simplifier as _simplifier

    tmp = Path(ctx["tmp"])
    adapter = resolve("yolo12n")
    loaded = adapter.load(None, random_init=True, seed=0)
    adapter.save_checkpoint(loaded, tmp / "yolo12n-random.pt")
    ctx["yolo_pt"] = tmp / "yolo12n-random.pt"
    res = api.export("yolo12n", random_init=True, output=tmp / "yolo12n.onnx", quiet=True, simplifier=_simplifier())
    ctx["yolo_onnx"] = res.output
    ctx["depth_weights"] = depth_weights(tmp)
    res = api.export("depth", weights=ctx["depth_weights"], input="1x3x518x518", output=tmp / "depth.onnx", quiet=True,
                     simplifier=_simplifier())
    ctx["depth_onnx"] = res.output


def depth_weights(tmp: Path) -> Path:
    """Depth-Anything-V2-small with every layer at PyTorch's default init, saved: a depth map that varies.

    (transformers' own init of the random model can give a constant, even all-zero, depth map, and
    comparing two constant maps proves nothing.)"""
    import torch

    from enginekit.families import resolve

    adapter = resolve("depth")
    loaded = adapter.load(None, random_init=True, seed=0)
    torch.manual_seed(0)
    for layer in loaded.module.modules():
        if hasattr(layer, "reset_parameters") and layer is not loaded.module:
            layer.reset_parameters()
    # the head ends in a ReLU: a random head whose last bias lands negative gives an all-zero map
    loaded.module.model.head.conv3.bias.data.fill_(1.0)
    path = tmp / "depth-reinit.safetensors"
    adapter.save_checkpoint(loaded, path)
    return path


def section_agree(ctx) -> None:
    import torch

    import enginekit

    _models(ctx)
    frame, _ = photo()
    # yolo12n: raw outputs on the same batch, and detections at a low threshold (random weights score low)
    ort_p = enginekit.load(str(ctx["yolo_onnx"]), backend="onnxruntime-cuda", conf=1e-4, max_det=100,
                           cuda_graph=False)
    torch_p = enginekit.load("yolo12n", random_init=True, backend="torch", conf=1e-4, max_det=100, cuda_graph=False)
    x = torch.rand((2, 3, 640, 640), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.cuda.stream(ort_p.stream):
        a = ort_p.session(x)["output0"].clone()
    torch.cuda.synchronize()
    b = torch_p.session(x)["output0"]
    torch.cuda.synchronize()
    note(f"agree yolo12n raw (random input, batch 2): ORT CUDA vs torch CUDA rel L2 {rel_l2(a.cpu(), b.cpu()):.2e}")
    note(f"agree yolo12n detections on bus.jpg (conf 1e-4): {match_detections(ort_p(frame), torch_p(frame))}")
    ctx["agree_yolo_rel_l2"] = rel_l2(a.cpu(), b.cpu())
    # Depth-Anything-V2-small
    d_ort = enginekit.load(str(ctx["depth_onnx"]), backend="onnxruntime-cuda", cuda_graph=False)
    d_torch = enginekit.load("depth", weights=ctx["depth_weights"], backend="torch", cuda_graph=False)
    x = torch.randn((1, 3, 518, 700), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    with torch.cuda.stream(d_ort.stream):
        a = d_ort.session(x)["depth"].clone()
    torch.cuda.synchronize()
    b = d_torch.session(x)["depth"]
    torch.cuda.synchronize()
    ra, rb = d_ort(frame), d_torch(frame)
    note(f"agree depth: torch output mean {b.mean().item():.4g} std {b.std().item():.4g}; ORT mean {a.mean().item():.4g}")
    note(f"agree depth raw (random 518x700 input): rel L2 {rel_l2(a.cpu(), b.cpu()):.2e}; on bus.jpg at "
         f"{ra.depth.shape}: rel L2 {rel_l2(ra.depth, rb.depth):.2e}")
    if ctx.get("trained"):
        w = Path(ctx["trained"])
        t_ort = enginekit.load(ctx["trained_model"], weights=w, backend="onnxruntime-cuda", quiet=True)
        t_torch = enginekit.load(t_ort.model, weights=w, backend="torch", cuda_graph=False)
        import cv2

        from ultralytics import YOLO

        pics = sorted(Path(ctx["trained_images"]).glob("*.png")) if ctx.get("trained_images") else []
        ref_model = YOLO(str(w), task="detect")
        for pic in pics or [None]:
            img = cv2.imread(str(pic)) if pic else frame
            a, b = t_ort(img), t_torch(img)
            ref = ref_model.predict(img, imgsz=640, rect=False, device=0, verbose=False)[0].boxes
            note(f"agree trained {ctx['trained_model']} on {pic.name if pic else 'bus.jpg'}: ORT CUDA vs torch CUDA: "
                 f"{match_detections(a, b)}; enginekit ORT CUDA vs Ultralytics predict: {len(ref)} reference boxes, "
                 f"min IoU {box_iou(a.boxes, ref.xyxy.cpu().numpy()).max(1).min() if len(a) and len(ref) else float('nan'):.4f}")


def section_yolo(ctx) -> None:
    import torch
    from ultralytics import YOLO

    import enginekit

    if ctx.get("trained_onnx"):
        return _section_yolo_trained(ctx)
    _models(ctx)
    frame, _ = photo()
    iters = ctx["iters"]
    variants = [("enginekit ORT CUDA fp32", dict(target=str(ctx["yolo_onnx"]), backend="onnxruntime-cuda",
                                                 cuda_graph=False)),
                ("enginekit torch fp32 (CUDA graph)", dict(target="yolo12n", random_init=True, backend="torch")),
                ("enginekit torch fp16 (CUDA graph)", dict(target="yolo12n", random_init=True, backend="torch",
                                                             precision="fp16"))]
    if ctx.get("fp16_onnx"):
        variants.insert(1, ("enginekit ORT CUDA fp16", dict(target=ctx["fp16_onnx"], backend="onnxruntime-cuda",
                                                            cuda_graph=False)))
        variants.insert(2, ("enginekit ORT CUDA fp16 + ORT CUDA graph",
                            dict(target=ctx["fp16_onnx"], backend="onnxruntime-cuda", cuda_graph=True)))
    variants.insert(1, ("enginekit ORT CUDA fp32 + ORT CUDA graph",
                        dict(target=str(ctx["yolo_onnx"]), backend="onnxruntime-cuda", cuda_graph=True)))
    ctx["yolo_predictors"] = {}
    for label, kw in variants:
        try:
            target = kw.pop("target")
            p = enginekit.load(target, **kw)
            ctx["yolo_predictors"][label] = p
            row("yolo", f"{label}: host frame e2e", timed(lambda: p(frame), iters))
        except Exception as exc:  # noqa: BLE001
            note(f"{label}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    # Ultralytics' own predictor, same frame, same card
    for label, model, kw in [
        ("Ultralytics ONNX (ORT CUDA) predict", str(ctx["yolo_onnx"]), dict(rect=False)),
        ("Ultralytics PyTorch fp32 predict", str(ctx["yolo_pt"]), {}),
        ("Ultralytics PyTorch fp16 predict", str(ctx["yolo_pt"]), dict(half=True)),
    ]:
        try:
            m = YOLO(model, task="detect")
            fn = lambda: m.predict(frame, device=0, verbose=False, **kw)  # noqa: E731
            stats = timed(fn, iters)
            speed = m.predict(frame, device=0, verbose=False, **kw)[0].speed
            provider = ""
            if model.endswith(".onnx"):
                sess = getattr(getattr(m.predictor.model, "backend", None), "session", None) or getattr(
                    m.predictor.model, "session", None)
                provider = f" providers={sess.get_providers()[:1]}" if sess is not None else ""
            row("yolo", f"{label}: host frame e2e", stats,
                ultralytics_speed={k: round(v, 3) for k, v in speed.items()})
            note(f"{label}: Ultralytics' own split {speed}{provider}")
        except Exception as exc:  # noqa: BLE001
            note(f"{label}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    del torch


def _section_yolo_trained(ctx) -> None:
    """The trained detector on --frame: each enginekit backend and each way Ultralytics runs it, same process,
    same frame; the ratio of the best p50s."""
    from ultralytics import YOLO

    import enginekit

    frame, path = photo()
    iters = ctx["iters"]
    pt, fp32, fp16 = ctx["trained"], ctx["trained_onnx"], ctx.get("trained_fp16_onnx")
    variants = [("enginekit ORT CUDA fp32 + ORT CUDA graph", dict(target=fp32, backend="onnxruntime-cuda",
                                                                  cuda_graph=True)),
                ("enginekit torch fp32 (CUDA graph)", dict(target=ctx["trained_model"], weights=pt, backend="torch")),
                ("enginekit torch fp16 (CUDA graph)", dict(target=ctx["trained_model"], weights=pt, backend="torch",
                                                           precision="fp16"))]
    size = ctx.get("imgsz")  # one network size on both sides (a checkpoint trained small predicts at its own)
    sized = {"input_size": (size, size)} if size else {}
    for _, kw in variants:
        if kw.get("weights"):
            kw.update(sized)
    if fp16:
        variants.insert(1, ("enginekit ORT CUDA fp16 + ORT CUDA graph", dict(target=fp16, backend="onnxruntime-cuda",
                                                                             cuda_graph=True)))
    best = {}
    for label, kw in variants:
        try:
            target = kw.pop("target")
            p = enginekit.load(target, **kw)
            stats = timed(lambda: p(frame), iters)
            row("yolo", f"trained {label}: host frame e2e", stats, found=p(frame).found())
            best.setdefault("enginekit", []).append((stats["p50"], label))
        except Exception as exc:  # noqa: BLE001
            note(f"{label}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    for label, model, kw in [("Ultralytics ONNX (ORT CUDA) predict", fp32, dict(rect=False)),
                             ("Ultralytics PyTorch fp32 predict", pt, {}),
                             ("Ultralytics PyTorch fp16 predict", pt, dict(half=True))]:
        try:
            m = YOLO(model, task="detect")
            if size:
                kw = {**kw, "imgsz": size}
            stats = timed(lambda: m.predict(frame, device=0, verbose=False, **kw), iters)
            found = len(m.predict(frame, device=0, verbose=False, **kw)[0].boxes)
            row("yolo", f"trained {label}: host frame e2e", stats, found=f"{found} boxes")
            best.setdefault("ultralytics", []).append((stats["p50"], label))
        except Exception as exc:  # noqa: BLE001
            note(f"{label}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    if best.get("enginekit") and best.get("ultralytics"):
        e, u = min(best["enginekit"]), min(best["ultralytics"])
        ratio = round(e[0] / u[0], 3)
        RATIOS.append({"ratio": ratio, "enginekit": e, "ultralytics": u})
        note(f"ratio (frame {frame.shape[1]}x{frame.shape[0]}): enginekit best {e[1]} {e[0]:.2f} ms / Ultralytics "
             f"best {u[1]} {u[0]:.2f} ms = {ratio} (goal <= 0.35)")


RATIOS: list[dict] = []


def section_net(ctx) -> None:
    """Network alone vs end to end with the frame already on the GPU (uint8 HWC tensor)."""
    import torch

    frame, _ = photo()
    gpu_frame = torch.from_numpy(frame).cuda()
    iters = ctx["iters"]
    for label, p in ctx.get("yolo_predictors", {}).items():
        x = torch.rand((1, 3, 640, 640), device="cuda")
        stream = p.stream or torch.cuda.current_stream()

        def net():
            with torch.cuda.stream(stream), torch.inference_mode():
                p.session(x)

        n = timed_sync(net, iters)
        row("net", f"{label}: network only", n)
        # by default a GPU frame is read back and letterboxed with OpenCV on the host (the .pt's input, bit for
        # bit); gpu_letterbox resizes it on the device (torch bilinear), the frame never leaving the GPU
        host = timed(lambda: p(gpu_frame), iters)
        row("net", f"{label}: GPU frame e2e, letterboxed on the host (default)", host,
            ratio_e2e_over_net=round(host["p50"] / n["p50"], 3))
        p.processor.gpu_letterbox = True
        graphed = p.graph_preprocess
        p.graph_preprocess = False  # the same predictor with its preprocessing launched kernel by kernel
        eager = timed(lambda: p(gpu_frame), iters)
        p.graph_preprocess = graphed
        e = timed(lambda: p(gpu_frame), iters)
        row("net", f"{label}: GPU frame e2e, gpu_letterbox, preprocessing not captured", eager,
            ratio_e2e_over_net=round(eager["p50"] / n["p50"], 3))
        row("net", f"{label}: GPU frame e2e, gpu_letterbox", e, ratio_e2e_over_net=round(e["p50"] / n["p50"], 3),
            preprocessing_captured=graphed)
        r = p(gpu_frame)
        p.processor.gpu_letterbox = False
        note(f"{label}: split of one GPU-frame run, gpu_letterbox (ms): pre {r.timings.preprocess:.3f}, "
             f"infer {r.timings.infer:.3f}, post {r.timings.postprocess:.3f}")


def section_fp16(ctx) -> None:
    """Why yolo12n's FP16 graph may be slower than FP32 on ORT CUDA: casts, NCHW layout, launch gaps."""
    import onnx
    import torch

    from enginekit.backends.ort import OnnxRuntimeCuda

    if not ctx.get("fp16_onnx"):
        note("fp16: no FP16 graph given (--fp16-onnx)")
        return
    _models(ctx)
    for label, path in (("fp32", ctx["yolo_onnx"]), ("fp16", ctx["fp16_onnx"])):
        m = onnx.load(str(path), load_external_data=False)
        ops: dict[str, int] = {}
        for n in m.graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        top = sorted(ops.items(), key=lambda kv: -kv[1])[:6]
        ctx.setdefault("ops", {})[label] = ops
        if label == "fp16":
            diff = {k: v - ctx["ops"]["fp32"].get(k, 0) for k, v in ops.items() if v != ctx["ops"]["fp32"].get(k, 0)}
            note(f"fp16: op counts fp16 minus fp32: {diff}")
        note(f"fp16: {label} graph has {len(m.graph.node)} nodes, Cast {ops.get('Cast', 0)}; top ops {top}")
    iters = ctx["iters"]
    x = torch.rand((1, 3, 640, 640), device="cuda")
    for label, path in (("fp32", ctx["yolo_onnx"]), ("fp16", ctx["fp16_onnx"])):
        for nhwc in (False, True):
            for graph in (False, True):
                try:
                    s = OnnxRuntimeCuda.open(Path(path), device="cuda:0", cuda_graph=graph, prefer_nhwc=nhwc)

                    def net():
                        with torch.cuda.stream(s.stream):
                            s(x)

                    row("fp16", f"yolo12n {label} prefer_nhwc={int(nhwc)} cuda_graph={int(graph)} network",
                        timed_sync(net, iters))
                except Exception as exc:  # noqa: BLE001
                    note(f"fp16 {label} nhwc={nhwc} graph={graph}: failed: {str(exc).splitlines()[0][:200]}")
    # ORT's profiler: where the FP16 run spends its time
    try:
        import onnxruntime as ort

        for label, path in (("fp32", ctx["yolo_onnx"]), ("fp16", ctx["fp16_onnx"])):
            opts = ort.SessionOptions()
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(ctx["tmp"]) / f"prof-{label}")
            opts.log_severity_level = 3
            sess = ort.InferenceSession(str(path), opts, providers=["CUDAExecutionProvider"])
            feed = {sess.get_inputs()[0].name: np.random.rand(1, 3, 640, 640).astype(np.float32)}
            for _ in range(40):
                sess.run(None, feed)
            prof = json.loads(Path(sess.end_profiling()).read_text())
            runs = sorted(ev["ts"] for ev in prof if ev.get("name") == "model_run")
            cutoff = runs[10] if len(runs) > 10 else 0  # the first runs search cuDNN algorithms
            counted = len([t for t in runs if t >= cutoff])
            per_op: dict[str, float] = {}
            for ev in prof:
                if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time") and ev["ts"] >= cutoff:
                    op = ev.get("args", {}).get("op_name", "?")
                    per_op[op] = per_op.get(op, 0.0) + ev.get("dur", 0) / 1e3 / counted
            note(f"fp16: ORT profile {label}: {sum(per_op.values()):.3f} ms of node time per run over "
                 f"{sum(1 for ev in prof if ev.get('cat') == 'Node' and ev['ts'] >= cutoff and ev.get('name', '').endswith('_kernel_time')) // max(counted, 1)} nodes")
            top = sorted(per_op.items(), key=lambda kv: -kv[1])[:6]
            note(f"fp16: ORT profile {label}, ms per run by op (host-side node time): "
                 + ", ".join(f"{k} {v:.3f}" for k, v in top))
    except Exception as exc:  # noqa: BLE001
        note(f"fp16 profile failed: {str(exc).splitlines()[0][:200]}")


def section_depth(ctx) -> None:
    import enginekit

    _models(ctx)
    frame, _ = photo()
    iters = max(ctx["iters"] // 2, 50)
    variants = [("enginekit ORT CUDA fp32", dict(target=str(ctx["depth_onnx"]), backend="onnxruntime-cuda",
                                                 cuda_graph=False)),
                ("enginekit torch fp32 (CUDA graph)", dict(target="depth", weights=ctx["depth_weights"], backend="torch")),
                ("enginekit torch fp16 (CUDA graph)", dict(target="depth", weights=ctx["depth_weights"], backend="torch",
                                                             precision="fp16"))]
    if ctx.get("depth_fp16_onnx"):
        variants.insert(1, ("enginekit ORT CUDA fp16", dict(target=ctx["depth_fp16_onnx"], backend="onnxruntime-cuda",
                                                            cuda_graph=False)))
        variants.insert(2, ("enginekit ORT CUDA fp16 + ORT CUDA graph",
                            dict(target=ctx["depth_fp16_onnx"], backend="onnxruntime-cuda", cuda_graph=True)))
    ctx["depth_predictors"] = {}
    for label, kw in variants:
        try:
            p = enginekit.load(kw.pop("target"), **kw)
            ctx["depth_predictors"][label] = p
            stats = timed(lambda: p(frame), iters)
            r = p(frame)
            row("depth", f"{label}: host frame e2e (518x700 in)", stats)
            note(f"depth {label}: split (ms) pre {r.timings.preprocess:.3f} infer {r.timings.infer:.3f} "
                 f"post {r.timings.postprocess:.3f}")
        except Exception as exc:  # noqa: BLE001
            note(f"depth {label}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def section_pipeline(ctx) -> None:
    from enginekit.runtime.predictor import Pipeline

    frame, _ = photo()
    iters = max(ctx["iters"] // 2, 50)
    yolo = ctx.get("yolo_predictors", {})
    depth = ctx.get("depth_predictors", {})
    pairs = [(k, v) for k, v in yolo.items() if "torch fp16" in k][:1] + [(k, v) for k, v in yolo.items()
                                                                          if "ORT CUDA fp32" == k[10:]][:1]
    for (ylabel, y) in pairs:
        dlabel = next((k for k in depth if ("torch fp16" in k) == ("torch fp16" in ylabel)), None)
        if dlabel is None:
            continue
        d = depth[dlabel]
        alone_y = timed(lambda: y(frame), iters)
        alone_d = timed(lambda: d(frame), iters)
        pipe = Pipeline([y, d])
        both = timed(lambda: pipe(frame), iters)
        seq = timed(lambda: (y(frame), d(frame)), iters)
        slower = max(alone_y["p50"], alone_d["p50"])
        row("pipeline", f"{ylabel} alone", alone_y)
        row("pipeline", f"{dlabel} (depth) alone", alone_d)
        row("pipeline", "both, one after the other", seq)
        row("pipeline", "both, concurrent streams (Pipeline)", both, ratio_over_slower=round(both["p50"] / slower, 3))
        pipe.close()


def section_depth8(ctx) -> None:
    """Depth-Anything-V2-small FP16 network alone at batch 1 and 8 (518x518): ORT CUDA on enginekit's FP16
    graph, on the same graph after ONNX Runtime's transformer optimizer (model_type vit), and PyTorch FP16
    with a CUDA graph (the anchor)."""
    import torch

    from enginekit import api
    from enginekit.families import resolve
    from enginekit.backends import Artifact
    from enginekit.backends.ort import OnnxRuntimeCuda
    from enginekit.backends.pytorch import Torch
    from enginekit.flows.load import simplifier as _simplifier

    _models(ctx)
    tmp = Path(ctx["tmp"])
    res = api.export("depth", weights=ctx["depth_weights"], input="1x3x518x518", output=tmp / "depth16.onnx", fp16=True,
                     quiet=True, simplifier=_simplifier())
    graphs = {"enginekit fp16 graph": res.output}
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        opt = optimize_model(str(res.output), model_type="vit", num_heads=6, hidden_size=384, opt_level=0, use_gpu=True)
        note(f"depth8: transformer optimizer fused {({k: v for k, v in opt.get_fused_operator_statistics().items() if v})}")
        opt.save_model_to_file(str(tmp / "depth16-opt.onnx"))
        graphs["+ ORT transformer optimizer"] = tmp / "depth16-opt.onnx"
    except Exception as exc:  # noqa: BLE001
        note(f"depth8: transformer optimizer failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    adapter = resolve("depth")
    loaded = adapter.load(ctx["depth_weights"], random_init=False, seed=0)
    iters = max(ctx["iters"] // 2, 50)
    for batch in (1, 8):
        x = torch.rand((batch, 3, 518, 518), device="cuda")
        module = Artifact.of_module(loaded.module, adapter.input_name, adapter.output_names, (None, 3, 518, 518))
        t = Torch.open(module, device="cuda:0", precision="fp16")
        torch_stats = timed_sync(lambda: t(x), iters)
        row("depth8", f"torch fp16 CUDA graph, batch {batch}", torch_stats)
        for label, path in graphs.items():
            for graph in (False, True):
                try:
                    s = OnnxRuntimeCuda.open(Path(path), device="cuda:0", cuda_graph=graph)

                    def net():
                        with torch.cuda.stream(s.stream):
                            s(x)
                    stats = timed_sync(net, iters)
                    row("depth8", f"ORT CUDA {label}{' + CUDA graph' if graph else ''}, batch {batch}", stats,
                        over_torch=round(stats["p50"] / torch_stats["p50"], 3))
                except Exception as exc:  # noqa: BLE001
                    note(f"depth8 {label} graph={graph} b{batch}: failed: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160]}")


def section_nms(ctx) -> None:
    """A --nms graph (greedy NMS in a Loop) on ORT CUDA: its kept boxes against ORT CPU's and against
    the plain graph + Ultralytics' NMS, and its time per frame against that plain path."""
    import cv2
    import torch

    import enginekit
    from enginekit import api

    if not ctx.get("trained"):
        note("nms: needs --trained (a random-weight detector keeps nothing at conf 0.25)")
        return
    from trained_detector import write_test_images

    tmp, w, model = Path(ctx["tmp"]), Path(ctx["trained"]), ctx["trained_model"]
    plain = api.export(model, weights=w, output=tmp / "plain.onnx", quiet=True).output
    graphs = {"fp32": api.export(model, weights=w, nms=True, output=tmp / "nms.onnx", quiet=True).output,
              "fp16": api.export(model, weights=w, nms=True, fp16=True, output=tmp / "nms.fp16.onnx", quiet=True).output}
    pics = [cv2.imread(str(p)) for p in sorted(write_test_images(tmp / "images").iterdir())]
    plain_cuda = enginekit.load(str(plain), backend="onnxruntime-cuda")
    for precision, graph in graphs.items():
        cpu = enginekit.load(str(graph), backend="onnxruntime-cpu")
        cuda = enginekit.load(str(graph), backend="onnxruntime-cuda")
        for i, img in enumerate(pics):
            note(f"nms {precision} image {i}: ORT CUDA vs ORT CPU: {match_detections(cuda(img), cpu(img))}; "
                 f"vs plain graph + Ultralytics NMS on ORT CUDA: {match_detections(cuda(img), plain_cuda(img))}")
        img = pics[0]
        row("nms", f"ORT CUDA {precision} --nms graph: host frame e2e", timed(lambda: cuda(img), ctx["iters"]))
        x = torch.rand((1, 3, 640, 640), device="cuda")

        def net(p=cuda):
            with torch.cuda.stream(p.stream), torch.inference_mode():
                p.session(x)

        row("nms", f"ORT CUDA {precision} --nms graph: network (+ NMS) only", timed_sync(net, ctx["iters"]))
        note(f"nms {precision}: ORT CUDA graph replay kept: {cuda.session.cuda_graph}")
    row("nms", "ORT CUDA fp32 plain graph + Ultralytics NMS: host frame e2e",
        timed(lambda: plain_cuda(pics[0]), ctx["iters"]))


SECTIONS = {"env": section_env, "agree": section_agree, "yolo": section_yolo, "net": section_net,
            "fp16": section_fp16, "depth": section_depth, "pipeline": section_pipeline, "depth8": section_depth8,
            "nms": section_nms}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp16-onnx")
    ap.add_argument("--depth-fp16-onnx")
    ap.add_argument("--trained")
    ap.add_argument("--trained-model", default="yolov8n")
    ap.add_argument("--trained-images")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json")
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--trained-onnx", help="the trained detector's FP32 graph (section yolo then times it)")
    ap.add_argument("--trained-fp16-onnx", help="its FP16 graph")
    ap.add_argument("--frame", help="the frame section yolo times (default: bus.jpg)")
    ap.add_argument("--imgsz", type=int, help="the trained detector's network size on every side (default: its own)")
    ap.add_argument("--repeat", type=int, default=1, help="run the sections this many times in this process")
    args = ap.parse_args()
    if args.frame:
        FRAME.append(Path(args.frame))
    ctx = {"iters": args.iters, "fp16_onnx": args.fp16_onnx, "depth_fp16_onnx": args.depth_fp16_onnx,
           "trained": args.trained, "trained_model": args.trained_model, "trained_images": args.trained_images, "tmp": tempfile.mkdtemp(prefix="enginekit-bench-"),
           "trained_onnx": args.trained_onnx, "trained_fp16_onnx": args.trained_fp16_onnx, "imgsz": args.imgsz}
    for name in [n for _ in range(max(1, args.repeat)) for n in args.only.split(",")]:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            SECTIONS[name](ctx)
        except Exception:  # noqa: BLE001
            traceback.print_exc(limit=4)
            note(f"section {name} failed (traceback above)")
        print(f"   ({time.perf_counter() - t0:.1f}s)", flush=True)
    print(f"\n## enginekit runtime on {ctx.get('card', '?')} (ms per frame; p50 / p95 / p99)")
    print(f"| section | what | p50 | p95 | p99 | FPS |\n|---|---|---|---|---|---|")
    for r in ROWS:
        print(f"| {r['section']} | {r['what']} | {r['p50']:.2f} | {r['p95']:.2f} | {r['p99']:.2f} | {r['fps']:.0f} |")
    print("\n" + "\n".join(f"- {n}" for n in NOTES))
    if RATIOS:
        import statistics

        values = [r["ratio"] for r in RATIOS]
        print(f"\nratio enginekit best / Ultralytics best per run: {values}; median {statistics.median(values):.3f} "
              f"(goal <= 0.35: {'met' if statistics.median(values) <= 0.35 else 'NOT met'})")
    if args.json:
        Path(args.json).write_text(json.dumps({"card": ctx.get("card"), "rows": ROWS, "notes": NOTES,
                                               "ratios": RATIOS}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
