"""A fused convolution block's bias and SiLU as one Triton kernel after the convolution (the torch backend on a GPU).

Fused for inference (BatchNorm folded into the convolution: ``fuse()``), each Ultralytics ``Conv`` block computes
``act(conv(x))``: torch runs the convolution, then its bias as one elementwise kernel and SiLU as another, each
reading and writing the whole activation (a YOLOv8s has 57 such blocks: about 120 small kernels per frame, a third of
its CUDA graph's nodes). ``fuse_blocks`` makes such a block run the convolution without its bias and then one kernel
that adds the bias and applies SiLU in place, with torch's own arithmetic: the sum rounded to the activation's dtype
(as torch's add), SiLU on it in float32 as ``x / (1 + exp(-x))`` with an IEEE exponential and division (as torch's
kernel), rounded again. It runs only on a channels-last output (the channel is the innermost index: the torch
backend makes its module channels-last on a GPU) where the kernel runs (``lazy_kernels``); elsewhere the block runs as
it was. ``unfuse_blocks`` puts the blocks back.
"""

from __future__ import annotations

from enginekit.lazy_kernels import LazyKernels, interpreted

#: elements per program
BLOCK = 1024
#: the attribute a patched block keeps its own forward under
_ORIGINAL = "_enginekit_forward"


def _make_kernel():
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice  # noqa: F401 - tl.extra.libdevice below

    @triton.jit
    def bias_silu(y_ptr, b_ptr, n, channels, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        y = tl.load(y_ptr + offs, mask=inside, other=0.0)
        b = tl.load(b_ptr + offs % channels, mask=inside, other=0.0)
        v = (y.to(tl.float32) + b.to(tl.float32)).to(y.dtype).to(tl.float32)  # torch's add, in the dtype
        if LIBDEVICE:  # CUDA's expf, as torch's kernel (Triton's own exp is an approximation there)
            e = tl.extra.libdevice.exp(-v)
        else:  # the interpreter's (NumPy's)
            e = tl.exp(-v)
        out = tl.math.div_rn(v, 1.0 + e)  # torch's SiLU: x / (1 + exp(-x)) in float32
        tl.store(y_ptr + offs, out.to(y.dtype), mask=inside)

    return bias_silu


_LAZY = LazyKernels(_make_kernel)


def kernel_usable(device) -> bool:
    """Whether the kernel runs for tensors on ``device`` (``lazy_kernels.LazyKernels.usable``)."""
    return _LAZY.usable(device)


def bias_silu_(y, bias) -> None:
    """``y`` (N, C, H, W, channels-last, contiguous in that layout) <- SiLU(y + bias) in place, one launch."""
    import triton

    n, channels = y.numel(), y.shape[1]
    _LAZY.get()[(triton.cdiv(n, BLOCK),)](y, bias, n, channels, BLOCK=BLOCK, LIBDEVICE=not interpreted())


def _fused_forwards() -> tuple:
    """The forward functions of a fused Ultralytics block that compute ``self.act(self.conv(x))``; none without
    Ultralytics."""
    try:
        from ultralytics.nn.modules import conv
    except Exception:  # noqa: BLE001 - no Ultralytics here: no such block
        return ()
    return tuple(getattr(c, "forward_fuse") for c in (conv.Conv, conv.RepConv) if hasattr(c, "forward_fuse"))


def _fusable(block, forwards: tuple) -> bool:
    import torch

    conv, act = getattr(block, "conv", None), getattr(block, "act", None)
    forward = block.__dict__.get("forward")  # fuse() sets the block's forward to its forward_fuse
    return (getattr(forward, "__func__", None) in forwards and getattr(forward, "__self__", None) is block
            and isinstance(conv, torch.nn.Conv2d) and conv.bias is not None and conv.padding_mode == "zeros"
            and type(act) is torch.nn.SiLU and not hasattr(block, "bn"))


def fuse_blocks(module) -> int:
    """Patch every fused ``act(conv(x))`` block of ``module`` (a 2-D convolution with a bias, SiLU, no BatchNorm) to
    add its bias and apply SiLU in one kernel after the convolution (channels-last outputs where the kernel runs;
    elsewhere as before). Returns how many blocks were patched."""
    forwards = _fused_forwards()
    if not forwards:
        return 0
    count = 0
    for block in module.modules():
        if _fusable(block, forwards):
            original = block.forward
            setattr(block, _ORIGINAL, original)
            block.forward = _fused_forward(block.conv, original)
            count += 1
    return count


def unfuse_blocks(module) -> int:
    """Undo ``fuse_blocks``: each patched block's own forward back. Returns how many."""
    count = 0
    for block in module.modules():
        original = block.__dict__.pop(_ORIGINAL, None)
        if original is not None:
            block.forward = original
            count += 1
    return count


def _fused_forward(conv, original):
    import torch
    import torch.nn.functional as F

    channels_last = torch.channels_last

    def forward(x):
        weight = conv.weight
        # a channels-last module (its weights in that layout: the output is too), or channels-last activations
        cl = weight.is_contiguous(memory_format=channels_last) and (
            not weight.is_contiguous() or x.is_contiguous(memory_format=channels_last))
        if not (cl and kernel_usable(weight.device)):
            return original(x)
        y = F.conv2d(x, weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)
        if not y.is_contiguous(memory_format=channels_last) or y.dtype != conv.bias.dtype:
            return F.silu(y.add_(conv.bias.view(1, -1, 1, 1)), inplace=True)
        bias_silu_(y, conv.bias)
        return y

    return forward
