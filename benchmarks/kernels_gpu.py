"""The runtime's own GPU kernels checked on a GPU against what they replace.

    python benchmarks/kernels_gpu.py [--weights best.pt ...]

1. The queued decode's four Triton kernels (``queued_kernels.decode``) against its torch operations
   (``queue_image(kernels=False)``), bit for bit: flags and kept rows on 60 crowded batches (1 to 80 classes,
   60 to 8400 anchors, ties, extra columns, four frame and network sizes), or declined by both.
2. The fused bias + SiLU (``conv_epilogue.bias_silu_``) against torch's add then SiLU, FP16 and FP32, value for value.
3. The torch backend's channels-last copy of each ``--weights`` checkpoint (FP16 and FP32) against the module as
   given (``_fall_back``), on bus.jpg at 640: the outputs' largest difference relative to their largest value.
4. Max pooling 5x5 in either layout (why the copy pools in the usual one).
"""
import argparse
import os
import sys
from pathlib import Path
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src")]
os.environ.setdefault("YOLO_OFFLINE", "1"); os.environ.setdefault("YOLO_VERBOSE", "False")
import numpy as np
import torch
from enginekit.families.ultralytics.queued_nms import pack, unpack, CAP
from enginekit.families.ultralytics import queued_kernels
from enginekit import conv_epilogue
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--weights", action="append", default=[], help="a detector checkpoint (repeatable)")
ARGS = ap.parse_args()
dev = torch.device("cuda:0")
print("kernels usable:", queued_kernels.usable(dev, CAP), conv_epilogue.kernel_usable(dev))

def crowded(g, anchors, nc, extra, ties):
    c = torch.rand(2, anchors, generator=g) * 300 + 20
    wh = torch.rand(2, anchors, generator=g) * 60 + 4
    s = torch.rand(nc, anchors, generator=g) ** 3
    if ties:
        s = (s * 8).round() / 8
    e = torch.randn(extra, anchors, generator=g)
    return torch.cat((c, wh, s, e))[None].float()

g = torch.Generator().manual_seed(1)
same = declined = total = rows = 0
for trial in range(60):
    nc, extra = [(1, 0), (3, 32), (80, 0), (2, 51)][trial % 4]
    anchors = [60, 500, 1764, 3024, 8400][trial % 5]
    conf, iou = [(0.25, 0.7), (0.5, 0.45), (0.1, 0.5)][trial % 3]
    shape = [(1080, 1920), (810, 1080), (480, 640), (1280, 720)][trial % 4]
    hw = [(224, 384), (640, 480), (384, 384), (640, 640)][trial % 4]
    pred = crowded(g, anchors, nc, extra, trial % 3 == 0).to(dev)
    width = pred.shape[1] - nc + 2
    ops = pack(pred, [shape], hw, conf, iou, nc=nc, kernels=False, rounds=CAP + 1)[0].cpu().numpy()
    tri = pack(pred, [shape], hw, conf, iou, nc=nc, kernels=True)[0].cpu().numpy()
    a, b = (unpack(v, width, 300, min(CAP, anchors)) for v in (ops, tri))
    total += 1
    if (a is None) != (b is None):
        print("DIFFER declined", trial, ops[:4], tri[:4]); continue
    if a is None:
        declined += 1; continue
    if np.array_equal(ops[:4], tri[:4]) and np.array_equal(a, b):
        same += 1; rows += len(a)
    else:
        print("DIFFER", trial, ops[:4], tri[:4], np.abs(a - b).max() if a.shape == b.shape else (a.shape, b.shape))
print(f"queued decode on cuda: kernels = torch operations bit for bit on {same} of {total - declined} answered ({rows} rows), {declined} declined by both")

# fused bias + SiLU on the GPU vs torch's add then SiLU
for dtype in (torch.float16, torch.float32):
    y = (torch.randn(1, 64, 80, 80, device=dev) * 4).to(dtype).contiguous(memory_format=torch.channels_last)
    b = torch.randn(64, device=dev).to(dtype)
    ref = torch.nn.functional.silu(y + b.view(1, -1, 1, 1))
    conv_epilogue.bias_silu_(y, b)
    print(f"bias_silu {dtype}: equal {int((y == ref).sum())} of {y.numel()}, max diff {float((y.float() - ref.float()).abs().max()):.3g}")

# the channels-last copy against the module, and pooling
import enginekit
from enginekit.images import embedded_image_paths
import cv2
bus = cv2.imread(str(next(p for p in embedded_image_paths() if p.name == "bus.jpg")))
for w, prec in [(w, prec) for w in ARGS.weights for prec in ("fp16", "fp32")]:
    p = enginekit.load(w, precision=prec, backend="torch", input_size=(640, 640))
    x = p.device_input([bus], p.chunks([bus])[0][0])
    fast = {k: v.clone() for k, v in p.session(x).items()}
    p.session._fall_back()
    plain = p.session(x)
    for k in fast:
        d = float((fast[k] - plain[k]).abs().max() / plain[k].abs().max())
        print(f"{w} {prec}: channels-last copy vs module, output {k}: max relative difference {d:.2e}")
t = torch.randn(1, 256, 20, 20, device=dev).half()
for name, v in (("nchw", t), ("channels_last", t.contiguous(memory_format=torch.channels_last))):
    for _ in range(10): torch.nn.functional.max_pool2d(v, 5, 1, 2)
    torch.cuda.synchronize(); s0 = torch.cuda.Event(enable_timing=True); s1 = torch.cuda.Event(enable_timing=True)
    s0.record()
    for _ in range(100): torch.nn.functional.max_pool2d(v, 5, 1, 2)
    s1.record(); torch.cuda.synchronize()
    print(f"max_pool2d 5x5 on 1x256x20x20 fp16 {name}: {s0.elapsed_time(s1) * 10:.1f} us")
