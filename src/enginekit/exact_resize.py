"""OpenCV's ``INTER_LINEAR`` resize of 8-bit images, bit for bit, in torch operations (any device).

OpenCV resizes uint8 images in fixed point: per output column and row, the source position
``(d + 0.5) * scale - 0.5`` (float32), its floor and fraction, two coefficients ``(1 - f, f)`` rounded to 11 bits
(``INTER_RESIZE_COEF_SCALE`` 2048). Columns clamp at the borders (fraction 0 at the first and last column); rows do
not (a row before the first reads the first row twice, with the fraction it has). The horizontal pass is exact
integer arithmetic (``pixel * coefficient``, 0..522240); the vertical pass is its vectorised kernel's
(``VResizeLinearVec_32s8u``: each row shifted right by 4, multiplied by its 16-bit coefficient keeping the high 16
bits, the two summed with 2 and shifted right by 2), which OpenCV 5 runs for every pixel. Ultralytics' ``LetterBox``
then pads with grey 114 (``cv2.copyMakeBorder``): exact too. So a frame letterboxed on a GPU here has the pixels
``YOLO(pt).predict`` gets from OpenCV on the host (``tests/test_exact_resize.py`` holds it to that, byte for byte).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from enginekit.lazy_kernels import LazyKernels, interpreted

BITS = 11
ONE = 1 << BITS
#: the vertical pass's rounding: ``(hi(b0 * (s0 >> 4)) + hi(b1 * (s1 >> 4)) + ROUND) >> 2``
ROUND = 2


@lru_cache(maxsize=256)
def axis_coefficients(src: int, dst: int, clamp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(first source index, second source index, first coefficient, second coefficient) of each of ``dst`` outputs
    along an axis of ``src`` samples, as OpenCV's resize computes them (``clamp``: columns; rows are not)."""
    scale = 1.0 / (dst / src)
    first = np.empty(dst, np.int64)
    a0 = np.empty(dst, np.int64)
    a1 = np.empty(dst, np.int64)
    one = np.float32(ONE)
    for d in range(dst):
        f = np.float32((d + 0.5) * scale - 0.5)
        s = math.floor(f)
        f = np.float32(f - np.float32(s))
        if clamp and s < 0:
            f, s = np.float32(0), 0
        if clamp and s >= src - 1:
            f, s = np.float32(0), src - 1
        first[d] = s
        a0[d] = int(np.rint(np.float32((np.float32(1) - f) * one)))
        a1[d] = int(np.rint(np.float32(f * one)))
    second = np.clip(first + 1, 0, src - 1)
    return np.clip(first, 0, src - 1), second, a0, a1


_DEVICE_TABLES: dict = {}


def _tables(src: int, dst: int, clamp: bool, device):
    """``axis_coefficients`` as int32/int64 tensors on ``device`` (made once per sizes and device)."""
    import torch

    key = (src, dst, clamp, str(device))
    found = _DEVICE_TABLES.get(key)
    if found is None:
        i0, i1, a0, a1 = axis_coefficients(src, dst, clamp)
        found = (torch.as_tensor(i0, device=device), torch.as_tensor(i1, device=device),
                 torch.as_tensor(a0, dtype=torch.int32, device=device),
                 torch.as_tensor(a1, dtype=torch.int32, device=device))
        if len(_DEVICE_TABLES) > 512:
            _DEVICE_TABLES.clear()
        _DEVICE_TABLES[key] = found
    return found


def prepare(frame_hw: tuple[int, int], size: tuple[int, int], device) -> None:
    """Make the tables a resize of ``frame_hw`` to ``size`` uses on ``device`` (before a CUDA graph captures it)."""
    (h, w), (oh, ow) = frame_hw, size
    _tables(w, ow, True, device)
    _tables(h, oh, False, device)


def resize_linear(x, size: tuple[int, int]):
    """``x`` (..., H, W): integer values 0..255 (uint8, or integral floats) -> (..., h, w) int32, equal to
    ``cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR)`` of the same uint8 image, channel by channel."""
    import torch

    h, w = x.shape[-2:]
    oh, ow = size
    if (h, w) == (oh, ow):
        return x.to(torch.int32)
    c0, c1, ca, cb = _tables(w, ow, True, x.device)
    r0, r1, ra, rb = _tables(h, oh, False, x.device)
    # the two source rows of each output row first, then the horizontal pass on those rows only (each row's pass is
    # independent of the others: the same integers as passing every source row, on 2 * h_out rows instead of h_in)
    pair = x.index_select(-2, torch.cat((r0, r1))).to(torch.int32)  # (the rows it reads, not the whole frame)
    rows = pair.index_select(-1, c0) * ca + pair.index_select(-1, c1) * cb  # exact: at most 255 * 2048
    rows >>= 4
    top, bottom = rows[..., :oh, :], rows[..., oh:, :]
    ra, rb = ra[:, None], rb[:, None]
    out = (((top * ra) >> 16) + ((bottom * rb) >> 16) + ROUND) >> 2
    return out.clamp_(0, 255)


def letterbox(x, resized: tuple[int, int], padding: tuple[int, int, int, int], value: int = 114):
    """``x`` (C, H, W) integer values -> (C, h, w) int32: resized to ``resized`` (h, w) as OpenCV resizes, then padded
    by ``padding`` (top, bottom, left, right) with ``value``, as Ultralytics' ``LetterBox`` does."""
    import torch

    top, bottom, left, right = padding
    inner = resize_linear(x, resized)
    if not any(padding):
        return inner
    c, uh, uw = inner.shape
    out = torch.full((c, uh + top + bottom, uw + left + right), value, dtype=torch.int32, device=x.device)
    out[:, top:top + uh, left:left + uw] = inner
    return out


# -- the same letterbox as one kernel, from the frame's bytes -------------------------------------------------------
#
# On a GPU the steps above are a dozen small launches over a float copy of the whole frame. ``letterbox_into`` does
# them in one Triton kernel that reads the HxWx3 uint8 frame where it is: per output pixel, the two source rows and
# columns of the tables above, the same integer passes and rounding, the grey border, the channels in the order
# asked (BGR to RGB), and the division by 255 as a 256-entry table that torch's own ``div`` made on the device (the
# value ``boxed.to(float32).div_(255)`` gives, bit for bit). Triton's interpreter (``TRITON_INTERPRET=1``) runs the
# same kernel on CPU tensors, which is how the suite checks it on a machine with no GPU.

_LUTS: dict = {}


def kernel_usable(device) -> bool:
    """Whether ``letterbox_into`` runs for tensors on ``device`` (``lazy_kernels.LazyKernels.usable``)."""
    return _KERNELS.usable(device)


def kernel_failed(exc: BaseException) -> None:
    """The kernel failed on this machine: torch's operations from now on."""
    _KERNELS.failed(exc)


def _lut(device):
    """0..255 as float32 divided by 255 with torch's ``div`` on ``device`` (the eager path's values)."""
    import torch

    key = str(device)
    found = _LUTS.get(key)
    if found is None:
        found = _LUTS[key] = torch.arange(256, dtype=torch.float32, device=device).div_(255)
    return found


def _make_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def letterbox_kernel(src, s_h, s_w, s_c, out, r0p, r1p, rap, rbp, c0p, c1p, cap, cbp, lut,
                         oh, ow, top, left, uh, uw, fill, rnd, SWAP: tl.constexpr, BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        total = oh * ow
        live = idx < total
        y = idx // ow
        x = idx - y * ow
        iy = y - top
        ix = x - left
        inside = live & (iy >= 0) & (iy < uh) & (ix >= 0) & (ix < uw)
        r0 = tl.load(r0p + iy, mask=inside, other=0)
        r1 = tl.load(r1p + iy, mask=inside, other=0)
        ra = tl.load(rap + iy, mask=inside, other=0)
        rb = tl.load(rbp + iy, mask=inside, other=0)
        c0 = tl.load(c0p + ix, mask=inside, other=0)
        c1 = tl.load(c1p + ix, mask=inside, other=0)
        ca = tl.load(cap + ix, mask=inside, other=0)
        cb = tl.load(cbp + ix, mask=inside, other=0)
        top0 = src + r0 * s_h
        top1 = src + r1 * s_h
        for ch in tl.static_range(3):
            sc = ch + SWAP * (2 - 2 * ch)  # the source channel: reversed where SWAP (BGR to RGB)
            p00 = tl.load(top0 + c0 * s_w + sc * s_c, mask=inside, other=0).to(tl.int32)
            p01 = tl.load(top0 + c1 * s_w + sc * s_c, mask=inside, other=0).to(tl.int32)
            p10 = tl.load(top1 + c0 * s_w + sc * s_c, mask=inside, other=0).to(tl.int32)
            p11 = tl.load(top1 + c1 * s_w + sc * s_c, mask=inside, other=0).to(tl.int32)
            upper = (p00 * ca + p01 * cb) >> 4  # the horizontal pass, exact, then OpenCV's shift by 4
            lower = (p10 * ca + p11 * cb) >> 4
            v = (((upper * ra) >> 16) + ((lower * rb) >> 16) + rnd) >> 2  # the vertical pass, as OpenCV rounds
            v = tl.minimum(tl.maximum(v, 0), 255)
            v = tl.where(inside, v, fill)
            tl.store(out + ch * total + idx, tl.load(lut + v, mask=live, other=0.0), mask=live)

    return letterbox_kernel


_KERNELS = LazyKernels(_make_kernel)
_BROKEN = _KERNELS.broken  # why the kernel does not run here (the torch operations above run instead)


def letterbox_into(frame, out, resized: tuple[int, int], padding: tuple[int, int, int, int], *, swap: bool,
                   value: int = 114, rounding: int = ROUND):
    """``frame`` (H, W, 3) uint8 tensor -> ``out`` (3, h, w) float32 tensor on the same device, written in place:
    ``letterbox`` of the frame (its channels reversed where ``swap``: BGR to RGB), divided by 255. One launch of the
    kernel (``kernel_usable`` says where it runs); ``rounding`` is the vertical pass's (only a test changes it).
    Returns the tables the launch read: whoever keeps a CUDA graph that captured it keeps them too."""
    h, w = frame.shape[:2]
    uh, uw = resized
    top, bottom, left, right = padding
    oh, ow = uh + top + bottom, uw + left + right
    if tuple(out.shape) != (3, oh, ow) or not out.is_contiguous():
        raise ValueError(f"letterbox_into: out is {tuple(out.shape)}, not a contiguous (3, {oh}, {ow})")
    rows = _tables(h, uh, False, frame.device)
    cols = _tables(w, uw, True, frame.device)
    lut = _lut(frame.device)
    block = 65536 if interpreted() else 1024
    s_h, s_w, s_c = frame.stride()[:3]
    kernel = _KERNELS.get()
    kernel[(-(-oh * ow // block),)](frame, s_h, s_w, s_c, out, *rows, *cols, lut, oh, ow, top, left, uh, uw,
                                   int(value), int(rounding), SWAP=int(bool(swap)), BLOCK=block)
    return rows, cols, lut

