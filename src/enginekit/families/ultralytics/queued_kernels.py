"""The queued decode as four Triton kernels (``queued_nms`` runs them where it can: ``decode``).

Step for step what ``queued_nms.queue_image`` does with about eighty small torch operations and a sort, in four
launches (and one fill):

- ``best_class`` (one program per ``ANCHORS`` anchors): each anchor's best class score and its class, as torch's
  ``max`` over the classes (the first of equal maxima); the candidates (above ``conf``) counted by an atomic
  counter, each taking a slot of a list of at most ``cap`` (their order there is the device's, and does not matter);
- ``rank`` (one program per ``RANKED`` listed candidates): each candidate's place in the stable sort by score,
  highest first, as the count of listed candidates before it (a higher score, or as high and an earlier anchor),
  compared with the other candidates only (not every anchor: on an H200, 47 us for yolo12n's 1764 anchors);
- ``suppression`` (one program per ``ROWS`` candidates): each pair's IoU with torchvision's arithmetic on the
  class-offset boxes, written as one byte per pair: bit 0 "i before j, both candidates, IoU above the threshold",
  bit 1 "IoU within ``border`` of the threshold";
- ``keep`` (one program): greedy NMS as the fixed point of "kept = a candidate no kept candidate before it
  suppresses", iterated from "all kept" until a round changes nothing (each round settles at least one more
  candidate, so it ends), whether a kept candidate's IoU with a later one is near the threshold, then the first
  ``max_det`` kept rows in score order (x1 y1 x2 y2 score class extra), scaled to the frame as Ultralytics'
  ``scale_boxes`` scales them on the tensor's device (on CUDA torch divides by a scalar as a multiplication by its
  float32 reciprocal; on the CPU it divides), and the four flags, written in place.

The IoU's division may differ from torchvision's by an ulp or two: the ``border`` flag (1e-6, far wider) sends any
pair that close to the threshold to ``kept_rows``, so the kept rows are the same. Triton compiles for CUDA devices;
its interpreter (``TRITON_INTERPRET=1``) runs the same kernels on the CPU, which is how the suite checks them on a
machine with no GPU.
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
             k, max_det, extra_at, extra, width, pad_x, pad_y, sx, sy, clip_w, clip_h, K: tl.constexpr,
             ROWS: tl.constexpr, SCALE: tl.constexpr):
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
        x1, y1, x2, y2 = cx - hw, cy - hh, cx + hw, cy + hh
        if SCALE == 1:  # scale_boxes on a CUDA tensor: the padding off, times the gain's float32 reciprocal, clipped
            x1 = tl.minimum(tl.maximum((x1 - pad_x) * sx, 0.0), clip_w)
            y1 = tl.minimum(tl.maximum((y1 - pad_y) * sy, 0.0), clip_h)
            x2 = tl.minimum(tl.maximum((x2 - pad_x) * sx, 0.0), clip_w)
            y2 = tl.minimum(tl.maximum((y2 - pad_y) * sy, 0.0), clip_h)
        if SCALE == 2:  # on a CPU tensor (the interpreter): divided by the gain
            x1 = tl.minimum(tl.maximum(tl.math.div_rn(x1 - pad_x, sx), 0.0), clip_w)
            y1 = tl.minimum(tl.maximum(tl.math.div_rn(y1 - pad_y, sy), 0.0), clip_h)
            x2 = tl.minimum(tl.maximum(tl.math.div_rn(x2 - pad_x, sx), 0.0), clip_w)
            y2 = tl.minimum(tl.maximum(tl.math.div_rn(y2 - pad_y, sy), 0.0), clip_h)
        row = out_ptr + 4 + at * width
        tl.store(row, x1, mask=take)
        tl.store(row + 1, y1, mask=take)
        tl.store(row + 2, x2, mask=take)
        tl.store(row + 3, y2, mask=take)
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

    @triton.jit
    def best_class(x_ptr, s_anchor, s_chan, score_ptr, cls_ptr, n_ptr, cand_ptr, cand_score_ptr, anchors, nc, conf,
                   cap, BLOCK: tl.constexpr, CLASSES: tl.constexpr):
        a = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        va = a < anchors
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        arg = tl.zeros((BLOCK,), tl.int32)
        for c0 in range(0, nc, CLASSES):  # torch's max over the classes: the first of equal maxima
            c = c0 + tl.arange(0, CLASSES)
            v = tl.load(x_ptr + a[:, None] * s_anchor + (4 + c)[None, :] * s_chan,
                        mask=va[:, None] & (c < nc)[None, :], other=float("-inf"))
            m = tl.max(v, axis=1)
            i = tl.argmax(v, axis=1, tie_break_left=True)
            better = m > best
            arg = tl.where(better, c0 + i, arg)
            best = tl.where(better, m, best)
        tl.store(score_ptr + a, best, mask=va)
        tl.store(cls_ptr + a, arg, mask=va)
        # the candidates (above conf) counted, and the first ``cap`` of them listed in any order (each takes a slot):
        # ``rank`` orders them by their scores and anchors, so the slots' order does not matter
        cand = va & (best > conf)
        slot = tl.atomic_add(n_ptr + tl.zeros((BLOCK,), tl.int32), 1, mask=cand)
        listed = cand & (slot < cap)
        tl.store(cand_ptr + slot, a, mask=listed)
        tl.store(cand_score_ptr + slot, best, mask=listed)

    @triton.jit
    def rank(cand_ptr, cand_score_ptr, order_ptr, n_ptr, k, BLOCK: tl.constexpr):
        start = tl.program_id(0) * BLOCK
        n = tl.load(n_ptr)
        lim = tl.where(n > k, 0, n)  # more candidates than it takes: declined (the flags), nothing to order
        if start < lim:
            i = start + tl.arange(0, BLOCK)
            vi = i < lim
            ai = tl.load(cand_ptr + i, mask=vi, other=0)
            si = tl.load(cand_score_ptr + i, mask=vi, other=0.0)
            ahead = tl.zeros((BLOCK,), tl.int32)  # candidates before each: a higher score, or as high and earlier
            for j0 in range(0, lim, BLOCK):
                j = j0 + tl.arange(0, BLOCK)
                vj = j < lim
                aj = tl.load(cand_ptr + j, mask=vj, other=0)
                sj = tl.load(cand_score_ptr + j, mask=vj, other=0.0)
                higher = sj[None, :] > si[:, None]
                earlier = (sj[None, :] == si[:, None]) & (aj[None, :] < ai[:, None])
                before = vj[None, :] & (higher | earlier)
                ahead += tl.sum(before.to(tl.int32), axis=1)
            tl.store(order_ptr + ahead, ai.to(tl.int64), mask=vi)  # the stable sort's place

    return suppression, keep, best_class, rank


_LAZY = LazyKernels(_make_kernels)  # (suppression, keep, best_class, rank), made on first use
_BROKEN = _LAZY.broken  # why the kernels do not run here (then torch's operations run instead)
#: anchors per program of ``best_class``, classes per step of it, candidates per program of ``rank``
ANCHORS, CLASSES, RANKED = 128, 16, 64


def _kernels():
    return _LAZY.get()


def decode(x, *, nc: int, k: int, cap: int, max_det: int, conf: float, thr: float, border: float, max_wh: int,
           scale=None):
    """The whole queued decode of one image in four launches: ``x`` (anchors, 4 + nc + extra) float32. Each anchor's
    best class (``best_class``: torch's ``max``; the candidates above ``conf`` counted and listed), the candidates in
    the stable sort's order by score (``rank``: each candidate's place is the count of those before it, a higher
    score or as high and earlier), then ``suppression`` and ``keep``. ``scale``: ``queued_nms.box_scale``'s (pad x,
    pad y, gain x, gain y, width, height), applied in ``keep`` with the arithmetic of ``scale_boxes`` on ``x``'s
    device (None: the rows stay in the network's pixels). Returns the packed tensor ``queue_image`` returns."""
    import numpy as np
    import torch
    import triton

    suppression, keep, best_class, rank = _kernels()
    anchors = x.shape[0]
    width, extra = x.shape[1] - nc + 2, x.shape[1] - 4 - nc
    score = torch.empty(anchors, dtype=torch.float32, device=x.device)
    cls = torch.empty(anchors, dtype=torch.int32, device=x.device)
    listed = torch.empty(cap, dtype=torch.int32, device=x.device)  # the candidates' anchors, in no order
    listed_score = torch.empty(cap, dtype=torch.float32, device=x.device)
    order = torch.empty(k, dtype=torch.int64, device=x.device)  # past the candidates: never read
    # the packed answer and, after it, the candidates' count (int32), zeroed together in one fill
    packed = torch.zeros(4 + max_det * width + 1, dtype=torch.float32, device=x.device)
    out, n = packed[:-1], packed[-1:].view(torch.int32)
    s_anchor, s_chan = x.stride(0), x.stride(1)
    best_class[(triton.cdiv(anchors, ANCHORS),)](x, s_anchor, s_chan, score, cls, n, listed, listed_score, anchors, nc,
                                               conf, cap, BLOCK=ANCHORS, CLASSES=CLASSES, num_warps=4)
    rank[(triton.cdiv(cap, RANKED),)](listed, listed_score, order, n, k, BLOCK=RANKED, num_warps=4)
    code = torch.empty((cap, cap), dtype=torch.uint8, device=x.device)
    flags = torch.empty(cap, dtype=torch.int32, device=x.device)
    mode, values = 0, (0.0, 0.0, 1.0, 1.0, 0.0, 0.0)
    if scale is not None:
        pad_x, pad_y, gain_x, gain_y, w, h = scale
        gx, gy = np.float32(gain_x), np.float32(gain_y)
        if x.device.type == "cuda":  # torch's CUDA division by a scalar: times its float32 reciprocal
            mode, gx, gy = 1, np.float32(1.0) / gx, np.float32(1.0) / gy
        else:
            mode = 2
        values = (float(pad_x), float(pad_y), float(gx), float(gy), float(w), float(h))
    suppression[(cap // ROWS,)](x, s_anchor, s_chan, cls, order, n, code, k, thr, border, float(max_wh),
                                K=cap, ROWS=ROWS, num_warps=8)
    keep[(1,)](x, s_anchor, s_chan, score, cls, order, n, code, flags, out, k, max_det, 4 + nc, extra, width,
               *values, K=cap, ROWS=ROWS, SCALE=mode, num_warps=2)  # 21 us on an H200; 8 warps: 47
    return out
