"""The queued decode's suppression and compaction as two Triton kernels (``queued_nms`` runs them where it can).

Step for step what ``queued_nms.queue_image`` does with about sixty small torch operations, in two launches:

- ``suppression`` (one program per ``ROWS`` candidates): each pair's IoU with torchvision's arithmetic on the
  class-offset boxes, written as one byte per pair: bit 0 "i before j, both candidates, IoU above the threshold",
  bit 1 "IoU within ``border`` of the threshold";
- ``keep`` (one program): greedy NMS as the fixed point of "kept = a candidate no kept candidate before it
  suppresses", iterated from "all kept" until a round changes nothing (each round settles at least one more
  candidate, so it ends), whether a kept candidate's IoU with a later one is near the threshold, then the first
  ``max_det`` kept rows in score order (x1 y1 x2 y2 score class extra) and the four flags, written in place.

Candidates and their order (the best class score, a stable sort) stay torch's, and so does ``scale_boxes``, which
must keep Ultralytics' own arithmetic on each device. The IoU's division may differ from torchvision's by an ulp or
two: the ``border`` flag (1e-6, far wider) sends any pair that close to the threshold to ``kept_rows``, so the kept
rows are the same. Triton compiles for CUDA devices; its interpreter (``TRITON_INTERPRET=1``) runs the same kernels
on the CPU, which is how the suite checks them on a machine with no GPU.
"""

from __future__ import annotations

from enginekit.lazy_kernels import LazyKernels, interpreted  # noqa: F401 - interpreted: the suite's check asks

#: candidates per program of the pairwise kernel, and per tile of the fixed-point rounds
ROWS = 16


def usable(device, cap: int) -> bool:
    """Whether the kernels run for tensors on ``device`` with ``cap`` candidates: where Triton runs
    (``lazy_kernels.LazyKernels.usable``) and ``cap`` a power of two of at least ``ROWS`` (a block's size)."""
    if cap < ROWS or cap & (cap - 1):
        return False
    return _LAZY.usable(device)


def failed(exc: BaseException) -> None:
    """The kernels failed on this machine (compilation, an old driver): torch's operations from now on."""
    _LAZY.failed(exc)


def _make_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def suppression(x_ptr, s_anchor, s_chan, cls_ptr, order_ptr, n_ptr, code_ptr, k, thr, border, max_wh,
                    K: tl.constexpr, ROWS: tl.constexpr):
        start = tl.program_id(0) * ROWS
        n = tl.load(n_ptr).to(tl.int32)
        lim = tl.where(n > k, 0, n)  # more candidates than it takes: declined (the flags), nothing to compute
        if start < lim:  # rows past the candidates: never read
            ri = start + tl.arange(0, ROWS)
            rj = tl.arange(0, K)
            vi, vj = ri < lim, rj < lim
            ai = tl.load(order_ptr + ri, mask=vi, other=0)
            aj = tl.load(order_ptr + rj, mask=vj, other=0)
            # xywh2xyxy (a half is exact), then the class offset, as kept_rows and torchvision get them
            cxi = tl.load(x_ptr + ai * s_anchor, mask=vi, other=0.0)
            cyi = tl.load(x_ptr + ai * s_anchor + s_chan, mask=vi, other=0.0)
            hwi = tl.load(x_ptr + ai * s_anchor + 2 * s_chan, mask=vi, other=0.0) * 0.5
            hhi = tl.load(x_ptr + ai * s_anchor + 3 * s_chan, mask=vi, other=0.0) * 0.5
            offi = tl.load(cls_ptr + ai, mask=vi, other=0).to(tl.float32) * max_wh
            cxj = tl.load(x_ptr + aj * s_anchor, mask=vj, other=0.0)
            cyj = tl.load(x_ptr + aj * s_anchor + s_chan, mask=vj, other=0.0)
            hwj = tl.load(x_ptr + aj * s_anchor + 2 * s_chan, mask=vj, other=0.0) * 0.5
            hhj = tl.load(x_ptr + aj * s_anchor + 3 * s_chan, mask=vj, other=0.0) * 0.5
            offj = tl.load(cls_ptr + aj, mask=vj, other=0).to(tl.float32) * max_wh
            x1i, y1i, x2i, y2i = (cxi - hwi) + offi, (cyi - hhi) + offi, (cxi + hwi) + offi, (cyi + hhi) + offi
            x1j, y1j, x2j, y2j = (cxj - hwj) + offj, (cyj - hhj) + offj, (cxj + hwj) + offj, (cyj + hhj) + offj
            w = tl.maximum(tl.minimum(x2i[:, None], x2j[None, :]) - tl.maximum(x1i[:, None], x1j[None, :]), 0.0)
            h = tl.maximum(tl.minimum(y2i[:, None], y2j[None, :]) - tl.maximum(y1i[:, None], y1j[None, :]), 0.0)
            inter = w * h
            area_i = (x2i - x1i) * (y2i - y1i)
            area_j = (x2j - x1j) * (y2j - y1j)
            m = inter / (area_i[:, None] + area_j[None, :] - inter)
            pair = vi[:, None] & vj[None, :] & (ri[:, None] < rj[None, :])
            code = ((m > thr) & pair).to(tl.int32) + 2 * ((tl.abs(m - thr) <= border) & pair).to(tl.int32)
            tl.store(code_ptr + ri[:, None] * K + rj[None, :], code.to(tl.uint8))

    @triton.jit
    def keep(x_ptr, s_anchor, s_chan, score_ptr, cls_ptr, order_ptr, n_ptr, code_ptr, flag_ptr, out_ptr,
             k, max_det, extra_at, extra, width, K: tl.constexpr, ROWS: tl.constexpr):
        r = tl.arange(0, K)
        n = tl.load(n_ptr).to(tl.int32)
        lim = tl.where(n > k, 0, n)
        valid = (r < lim).to(tl.int32)
        tl.store(flag_ptr + r, valid)  # the flags in memory, not carried by the loop (Triton's layouts)
        changed = lim + 1  # anything above 0: the first round runs
        while changed > 0:
            tl.debug_barrier()  # this round reads what the last one stored
            hits = tl.zeros((K,), dtype=tl.int32)
            for t in range(0, lim, ROWS):  # rows past the candidates suppress nothing
                rows = t + tl.arange(0, ROWS)
                by = tl.load(flag_ptr + rows)
                code = tl.load(code_ptr + rows[:, None] * K + r[None, :]).to(tl.int32)
                hits += tl.sum(by[:, None] * (code & 1), axis=0)
            before = tl.load(flag_ptr + r)
            now = valid * (hits == 0).to(tl.int32)
            changed = tl.sum((now != before).to(tl.int32), axis=0)
            tl.debug_barrier()  # every thread has read the round's flags before they are rewritten
            tl.store(flag_ptr + r, now)
        tl.debug_barrier()
        kept = tl.load(flag_ptr + r)  # the fixed point
        near = tl.zeros((K,), dtype=tl.int32)  # a kept candidate's IoU with a later one near the threshold
        for t in range(0, lim, ROWS):
            rows = t + tl.arange(0, ROWS)
            by = tl.load(flag_ptr + rows)
            code = tl.load(code_ptr + rows[:, None] * K + r[None, :]).to(tl.int32)
            near += tl.sum(by[:, None] * (code >> 1), axis=0)
        total = tl.sum(kept, axis=0)
        at = tl.cumsum(kept, axis=0) - 1  # place among the kept, in score order
        take = (kept == 1) & (at < max_det)
        a = tl.load(order_ptr + r, mask=take, other=0)
        cx = tl.load(x_ptr + a * s_anchor, mask=take, other=0.0)
        cy = tl.load(x_ptr + a * s_anchor + s_chan, mask=take, other=0.0)
        hw = tl.load(x_ptr + a * s_anchor + 2 * s_chan, mask=take, other=0.0) * 0.5
        hh = tl.load(x_ptr + a * s_anchor + 3 * s_chan, mask=take, other=0.0) * 0.5
        row = out_ptr + 4 + at * width
        tl.store(row, cx - hw, mask=take)
        tl.store(row + 1, cy - hh, mask=take)
        tl.store(row + 2, cx + hw, mask=take)
        tl.store(row + 3, cy + hh, mask=take)
        tl.store(row + 4, tl.load(score_ptr + a, mask=take, other=0.0), mask=take)
        tl.store(row + 5, tl.load(cls_ptr + a, mask=take, other=0).to(tl.float32), mask=take)
        for e in range(0, extra):
            tl.store(row + 6 + e, tl.load(x_ptr + a * s_anchor + (extra_at + e) * s_chan, mask=take, other=0.0),
                     mask=take)
        border = tl.sum(near, axis=0) > 0
        tl.store(out_ptr, tl.load(n_ptr).to(tl.float32))
        tl.store(out_ptr + 1, total.to(tl.float32))
        tl.store(out_ptr + 2, 1.0)  # settled: the loop ends only at the fixed point
        tl.store(out_ptr + 3, border.to(tl.float32))

    return suppression, keep


_LAZY = LazyKernels(_make_kernels)  # (suppression, keep), made on first use
_BROKEN = _LAZY.broken  # why the kernels do not run here (then torch's operations run instead)


def _kernels():
    return _LAZY.get()


def suppress_and_keep(x, score, cls, order, n, *, nc: int, k: int, cap: int, max_det: int, thr: float, border: float,
                      max_wh: int):
    """Launch both kernels for one image: ``x`` (anchors, 4 + nc + extra) float32, ``score``/``cls`` its best class
    per anchor, ``order`` the first ``k`` candidates in score order, ``n`` their count (a 0-d tensor). Returns the
    packed tensor ``queue_image`` returns, before ``scale_boxes``: the four flags, then ``max_det`` rows (zeros past
    the kept ones)."""
    import torch

    suppression, keep = _kernels()
    width = x.shape[1] - nc + 2
    extra = x.shape[1] - 4 - nc
    code = torch.empty((cap, cap), dtype=torch.uint8, device=x.device)
    flags = torch.empty(cap, dtype=torch.int32, device=x.device)
    out = torch.zeros(4 + max_det * width, dtype=torch.float32, device=x.device)
    order = order.contiguous()
    score, cls = score.contiguous(), cls.contiguous()
    s_anchor, s_chan = x.stride(0), x.stride(1)
    suppression[(cap // ROWS,)](x, s_anchor, s_chan, cls, order, n, code, k, thr, border, float(max_wh),
                                K=cap, ROWS=ROWS, num_warps=8)
    keep[(1,)](x, s_anchor, s_chan, score, cls, order, n, code, flags, out, k, max_det, 4 + nc, extra, width,
               K=cap, ROWS=ROWS, num_warps=8)
    return out
