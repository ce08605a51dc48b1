"""Detection postprocessing queued on the device with no wait until its one small copy to the host.

``kept_rows`` (Ultralytics' arithmetic, torchvision's NMS) waits on the device for the candidates' count and again
inside torchvision's NMS, and every step after a wait is launched by the host while the GPU idles. Here every step
has a fixed shape, so the host queues all of it (one CUDA graph: ``Predictor._queue_postprocess``) while the
network still runs, and the first wait is for the last copy:

- candidates: the best class score per anchor above ``conf`` (as Ultralytics), ordered by score, highest first,
  equal scores in anchor order (a stable sort), the first ``cap`` of them;
- suppression: the IoU of every pair of candidates with torchvision's arithmetic on the class-offset boxes, and
  greedy NMS as a fixed point: a candidate is kept when no kept candidate before it overlaps it above ``iou``.
  That rule defines one answer (each candidate depends only on those before it), torchvision's; iterated from
  "all kept", every round settles at least one more candidate, and a round that changes nothing has reached it;
- the first ``max_det`` kept rows, scaled to the frame by Ultralytics' ``scale_boxes``, copied to pinned memory
  with four flags in one copy.

On a CUDA device with Triton, the whole decode runs as four Triton kernels (``queued_kernels``: the same
candidates and order, the same rule iterated until a round changes nothing, ``scale_boxes``' arithmetic) instead of
about eighty small torch operations and a sort.

The host then reads the flags and takes the rows, or, where the flags say this path could differ from
``kept_rows``, computes them by ``kept_rows`` itself: more candidates than ``cap``; no fixed point within
``rounds``; a kept candidate's IoU with a later one within 1e-6 of the threshold (torchvision's kernel may fuse
its multiply-adds). Equal scores: torchvision sorts the candidates before its NMS, stably on the CPU and on CUDA
for more than 32 of them, so two overlapping candidates of one score keep the first in anchor order, as here; its
CUDA sort of at most 32 candidates is not stable, so there Ultralytics on a GPU may keep the other of such a pair
(the CPU's choice is this one). Otherwise the rows are ``kept_rows``' bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: candidates the queued path takes (their IoU matrix is cap x cap); more go through ``kept_rows``
CAP = 512
#: rounds of the fixed-point iteration before the result is checked
ROUNDS = 8
#: IoU this close to the threshold: decided by torchvision's own kernel (``kept_rows``)
BORDER = 1e-6
FLAGS = 4  # candidates, kept, settled, border


def unpack(buf: np.ndarray, width: int, max_det: int, cap: int) -> np.ndarray | None:
    """One image's packed values (``queue_image``'s, copied to the host) -> its (N, width) float32 rows, or None
    where ``kept_rows`` must decide (the flags)."""
    n, kept, settled, border = (float(v) for v in buf[:FLAGS])
    if n > cap or not settled or border:
        return None
    count = int(min(kept, max_det))
    return buf[FLAGS:].reshape(max_det, width)[:count].copy()


@dataclass
class Queued:
    """One image's queued rows: ``host`` is filled once ``ready`` (a CUDA event, or None on the CPU) is."""

    host: Any
    ready: Any
    width: int  # columns per row
    max_det: int
    cap: int = CAP  # candidates it took

    def rows(self):
        """(N, width) float32 NumPy rows, or None where ``kept_rows`` must decide (the flags)."""
        if self.ready is not None:
            self.ready.synchronize()
        return unpack(self.host.numpy(), self.width, self.max_det, self.cap)


def pairwise_iou(boxes):
    """IoU of every pair of xyxy ``boxes`` (K, 4) as torchvision's NMS kernel computes it in float32."""
    import torch

    lt = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    wh = (rb - lt).clamp_(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / (area[:, None] + area[None, :] - inter)


#: (network h x w, frame h x w) -> ``box_scale``'s answer
_SCALES: dict = {}


def box_scale(hw: tuple, image_hw: tuple):
    """``(pad_x, pad_y, gain_x, gain_y, width, height)``: what Ultralytics' ``scale_boxes(hw, boxes, image_hw)``
    subtracts, divides by and clips to, each box side alone (its arithmetic as of 8.3: the letterbox's rounded sides,
    one gain per axis), so that a kernel can apply it; None where the installed Ultralytics computes otherwise
    (checked once per sizes on a probe of boxes inside the frame, against its own function on the CPU)."""
    key = (tuple(hw), tuple(image_hw))
    if key in _SCALES:
        return _SCALES[key]
    import torch
    from ultralytics.utils.ops import scale_boxes

    (h, w), (ih, iw) = key
    gain = min(h / ih, w / iw)
    new_h, new_w = (max(round(v * gain), 1) for v in (ih, iw))
    gain_y, gain_x = new_h / ih, new_w / iw
    pad_x, pad_y = round((w - new_w) / 2 - 0.1), round((h - new_h) / 2 - 0.1)
    probe = torch.tensor([[pad_x + 0.75, pad_y + 1.25, w - pad_x - 1.5, h - pad_y - 0.5],
                          [pad_x + 3.3, pad_y + 7.1, pad_x + 9.9, pad_y + 11.7],
                          [pad_x - 2.0, pad_y - 3.0, w - pad_x + 4.0, h - pad_y + 1.0]], dtype=torch.float32)
    theirs = scale_boxes(key[0], probe.clone(), key[1])
    mine = torch.stack(((probe[:, 0] - pad_x) / gain_x, (probe[:, 1] - pad_y) / gain_y,
                        (probe[:, 2] - pad_x) / gain_x, (probe[:, 3] - pad_y) / gain_y), 1)
    mine = torch.minimum(torch.maximum(mine, torch.zeros(())), torch.tensor([iw, ih, iw, ih], dtype=torch.float32))
    answer = (pad_x, pad_y, gain_x, gain_y, iw, ih) if torch.equal(theirs, mine) else None
    if len(_SCALES) > 4096:
        _SCALES.clear()
    _SCALES[key] = answer
    return answer


def queue_image(x, conf: float, iou: float, *, nc: int, max_det: int, image_hw, hw, cap: int = CAP,
                rounds: int = ROUNDS, max_wh: int = 7680, kernels: bool | None = None):
    """Queue one image's decode: ``x`` (anchors, 4 + nc + extra) float32 on its device. Returns the packed tensor
    on the device: FLAGS values, then ``max_det`` rows of x1 y1 x2 y2 (in ``image_hw``'s pixels) score class
    extra. ``kernels``: the whole decode by ``queued_kernels``' four Triton kernels (the candidates, their order,
    suppression iterated to the fixed point: ``rounds`` does not apply, compaction with ``scale_boxes``' arithmetic)
    rather than torch's operations; default: where they run (a CUDA device with Triton; ``cap`` a power of two)."""
    import torch
    from ultralytics.utils.ops import scale_boxes, xywh2xyxy

    device = x.device
    anchors, width = x.shape[0], x.shape[1] - nc + 2
    k = min(anchors, cap)
    thr = float(np.float32(iou))  # the threshold as float32, as torchvision's kernel
    from enginekit.families.ultralytics import queued_kernels

    if kernels is None:
        kernels = queued_kernels.usable(device, cap)
    if kernels:
        scale = box_scale(tuple(hw), tuple(image_hw))
        try:
            packed = queued_kernels.decode(x, nc=nc, k=k, cap=cap, max_det=max_det, conf=conf, thr=thr, border=BORDER,
                                           max_wh=max_wh, scale=scale)
        except Exception as exc:  # noqa: BLE001 - Triton failed to build or run here: torch's operations instead
            if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
                raise
            queued_kernels.failed(exc)
        else:
            if scale is None:  # an Ultralytics whose scale_boxes computes otherwise: its own function
                out_rows = packed[FLAGS:].view(max_det, width)
                out_rows[:, :4] = scale_boxes(tuple(hw), out_rows[:, :4].clone(), tuple(image_hw))
            return packed
    score, cls = x[:, 4:4 + nc].max(1)
    cand = score > conf
    n = cand.sum()
    ranked = torch.where(cand, score, torch.full_like(score, float("-inf")))
    order = ranked.sort(descending=True, stable=True).indices[:k]
    ranks = torch.arange(k, device=device)
    valid = ranks < n
    s = score[order]
    c = cls[order].float()
    rows = torch.cat((xywh2xyxy(x[order, :4]), s[:, None], c[:, None], x[order, 4 + nc:]), 1)
    m = pairwise_iou(rows[:, :4] + c[:, None] * max_wh)
    pair = valid[:, None] & valid[None, :] & (ranks[:, None] < ranks[None, :])  # i before j, both candidates
    suppresses = (m > thr) & pair
    # a round: kept = candidate and suppressed by no kept one before it (counts of 0/1 products: exact in float32)
    weights, candidate = suppresses.float(), valid.float()
    keep_f = before = candidate
    for _ in range(rounds):
        before = keep_f
        keep_f = candidate * (keep_f @ weights).eq(0)
    settled = (keep_f == before).all()
    keep = keep_f.bool()
    # only a kept candidate's comparisons decide anything: none of them near the threshold, the same greedy answer
    border = (((m - thr).abs() <= BORDER) & pair & keep[:, None]).any()
    kept = keep.sum()
    first = (~keep).to(torch.uint8).argsort(stable=True)[:max_det]  # kept first, in score order
    out_rows = rows[first]
    if out_rows.shape[0] < max_det:
        out_rows = torch.cat((out_rows, out_rows.new_zeros((max_det - out_rows.shape[0], width))))
    out_rows[:, :4] = scale_boxes(tuple(hw), out_rows[:, :4].clone(), tuple(image_hw))
    flags = torch.stack((n.float(), kept.float(), settled.float(), border.float()))
    return torch.cat((flags, out_rows.reshape(-1)))


def pack(pred, image_hws, hw, conf: float, iou: float, *, nc: int = 0, max_det: int = 300, cap: int = CAP,
         rounds: int = ROUNDS, kernels: bool | None = None) -> list:
    """A batch ``pred`` (B, 4 + nc + extra, anchors) -> one packed device tensor per image (``queue_image``): device
    work only, fixed shapes, no wait (a CUDA graph can hold it)."""
    nc = nc or (pred.shape[1] - 4)
    return [queue_image(x, conf, iou, nc=nc, max_det=max_det, image_hw=shape, hw=hw, cap=cap, rounds=rounds,
                        kernels=kernels)
            for x, shape in zip(pred.transpose(-1, -2), image_hws)]


def queue_rows(pred, image_hws, hw, conf: float, iou: float, *, nc: int = 0, max_det: int = 300,
               cap: int = CAP, rounds: int = ROUNDS, kernels: bool | None = None) -> list[Queued]:
    """Queue the decode of a batch ``pred`` on the current stream, eagerly: one ``Queued`` per image, each with its
    copy to pinned memory and an event (no wait here)."""
    import torch

    nc = nc or (pred.shape[1] - 4)
    width, taken = pred.shape[1] - nc + 2, min(cap, pred.shape[-1])
    out = []
    for packed in pack(pred, image_hws, hw, conf, iou, nc=nc, max_det=max_det, cap=cap, rounds=rounds,
                       kernels=kernels):
        if packed.device.type == "cuda":
            host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(packed.device))
        else:
            host, ready = packed, None
        out.append(Queued(host, ready, width, max_det, taken))
    return out
