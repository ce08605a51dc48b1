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
