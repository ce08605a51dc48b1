"""The fused convolution blocks' bias and SiLU as one kernel (``enginekit.conv_epilogue``), as the torch backend runs
them on a GPU: checked here in Triton's interpreter (``TRITON_INTERPRET=1``) on the CPU, on a YOLO whose BatchNorm
statistics are random (after ``fuse()`` each block's bias is then far from zero: a kernel that dropped it would be
seen), in channels-last layout as the backend makes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_CHECK = r"""
import copy, sys
sys.path[:0] = sys.argv[1:2]
import torch
from ultralytics.nn.tasks import DetectionModel
from enginekit import conv_epilogue

assert conv_epilogue.kernel_usable(torch.device("cpu")), conv_epilogue._LAZY.broken
torch.manual_seed(0)
model = DetectionModel("yolov8n.yaml", nc=3, verbose=False).eval()
for m in model.modules():
    if isinstance(m, torch.nn.BatchNorm2d):  # statistics a trained model has: biases far from zero once folded
        m.running_mean.uniform_(-0.5, 0.5); m.running_var.uniform_(0.5, 2.0)
        m.weight.data.uniform_(0.5, 1.5); m.bias.data.uniform_(-1.0, 1.0)
model.fuse()
x = torch.rand(1, 3, 96, 160)  # a non-square input
with torch.inference_mode():
    want = model(x)[0]
    fast = copy.deepcopy(model).to(memory_format=torch.channels_last)
    patched = conv_epilogue.fuse_blocks(fast)
    blocks = sum(1 for m in fast.modules() if hasattr(m, "_enginekit_forward"))
    got = fast(x)[0]
    diff = float((got - want).abs().max() / want.abs().max())
    # the comparison sees a bias left out: the same copy with every patched block's bias zeroed
    for m in fast.modules():
        if hasattr(m, "_enginekit_forward"):
            m.conv.bias.zero_()
    dropped = float((fast(x)[0] - want).abs().max() / want.abs().max())
    restored = conv_epilogue.unfuse_blocks(fast)
    # the kernel alone, on a channels-last activation of odd sizes, against torch's add and SiLU
    y = torch.randn(2, 24, 7, 5).to(memory_format=torch.channels_last) * 4
    b = torch.randn(24)
    ref = torch.nn.functional.silu(y + b.view(1, -1, 1, 1))
    conv_epilogue.bias_silu_(y, b)
    kernel = float((y - ref).abs().max())
    # a block in the usual layout runs as it was (its own forward): the same values as before
    plain = copy.deepcopy(model)
    conv_epilogue.fuse_blocks(plain)
    same = torch.equal(plain(x)[0], want)
print(patched, blocks, restored, diff, dropped, kernel, same)
"""


def test_the_fused_bias_and_silu_give_the_modules_outputs():
    """Every fused Conv block of a YOLOv8n is patched; the channels-last copy's outputs are the module's (float32
    relative difference under 1e-5, the convolution's own reordering), while zeroing the patched biases moves
    them far; the kernel alone is torch's add and SiLU within float32's rounding; blocks in the usual layout run
    their own forward unchanged; unfusing restores every block."""
    pytest.importorskip("triton")
    pytest.importorskip("ultralytics")
    here = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", _CHECK, str(here.parent / "src")],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    patched, blocks, restored, diff, dropped, kernel, same = done.stdout.split()[-7:]
    assert int(patched) == int(blocks) == int(restored) >= 50, (patched, blocks, restored)
    assert float(diff) < 1e-5, diff
    assert float(dropped) > 1e-2, dropped
    assert float(kernel) < 1e-5, kernel
    assert same == "True"


def test_the_torch_backends_fast_copy_leaves_the_module_and_pools_in_the_usual_layout():
    """``backends.pytorch._fast_module`` (what the torch backend runs on a GPU) is a channels-last copy: the module
    given keeps its layout and its own forwards (export traces it), the copy's max pooling runs on the usual layout
    and gives channels-last back, and the copy's outputs are the module's (here on the CPU, where the fused kernel
    does not run: only the layout differs)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ultralytics")
    from ultralytics.nn.tasks import DetectionModel

    from enginekit import conv_epilogue
    from enginekit.backends.pytorch import _fast_module

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=3, verbose=False).eval()
    model.fuse()
    fast = _fast_module(model)
    assert fast is not model
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1)]
    assert convs and all(m.weight.is_contiguous() for m in convs)  # the module as given
    assert not any(hasattr(m, "_enginekit_forward") for m in model.modules())
    assert sum(hasattr(m, "_enginekit_forward") for m in fast.modules()) >= 50
    pool = next(m for m in fast.modules() if type(m) is torch.nn.MaxPool2d)
    y = pool(torch.rand(1, 8, 20, 20).contiguous(memory_format=torch.channels_last))
    assert y.is_contiguous(memory_format=torch.channels_last) and y.shape == (1, 8, 20, 20)
    x = torch.rand(1, 3, 96, 160)
    with torch.inference_mode():
        want, got = model(x)[0], fast(x)[0]
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    assert conv_epilogue.unfuse_blocks(fast) >= 50
