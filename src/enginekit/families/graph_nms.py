"""Greedy NMS in ordinary ONNX operators, for graphs that end in NMS (``--nms``).

Ultralytics' ``nms=True`` wrapper calls ``torchvision.ops.nms``, which exports as ONNX
NonMaxSuppression: TensorRT-RTX's builder has no implementation of that layer. This module gives
the same kept boxes without it: Cluster-NMS (Zheng et al., "Enhancing Geometric Factors in Model
Learning and Inference for Object Detection and Instance Segmentation", 2021), which iterates
Fast-NMS on the kept set until it stops changing and so equals greedy NMS exactly: after ``t``
rounds the first ``t`` boxes by score are settled, and in practice it settles in a few rounds.
In ONNX it is one IoU matrix and a Loop whose condition is "something changed" (TensorRT builds
it as an ILoopLayer; ONNX Runtime runs it).

Like Ultralytics' Fast-NMS export path, the function zeroes the scores of the boxes it suppresses
in place and returns every index, kept ones first by score: the caller's fixed-size output stays
fixed-size, and rows scored 0 are zeroed downstream.
"""

from __future__ import annotations

import contextlib
import functools


@functools.lru_cache(maxsize=1)
def _settle():
    """The scripted loop (scripted once, on first use: TorchScript exports its while as ONNX Loop)."""
    import torch

    @torch.jit.script
    def settle(suppresses: torch.Tensor) -> torch.Tensor:
        # suppresses[j, i]: box j ranks above box i and overlaps it past the threshold (bool). A box
        # is kept unless a kept box suppresses it; settled when a round changes nothing (at most
        # n + 1 rounds: round t settles box t). No float and no If in the body: mixed-precision
        # passes leave it as it is.
        keep = torch.ones_like(suppresses[0])
        changed = torch.ones((), dtype=torch.bool)
        while bool(changed):
            kept = torch.logical_not(torch.any(torch.logical_and(suppresses, keep.unsqueeze(1)), dim=0))
            changed = torch.any(torch.logical_xor(kept, keep))
            keep = kept
            # The matrix passes through the loop as a carried value, an input of the Loop node: read
            # from the enclosing graph instead, its producer has no consumer there, and graph
            # clean-ups that do not look into loop bodies (ModelOpt AutoCast's) delete it.
            suppresses = torch.logical_and(suppresses, suppresses)
        return keep

    return settle


def greedy_nms(boxes, scores, iou_threshold: float):
    """Indices of ``boxes`` (N, 4 corners), kept ones first by descending score; the scores of the
    suppressed ones set to 0 in ``scores``. The kept indices are ``torchvision.ops.nms``'s."""
    import torch
    from torchvision.ops import box_iou

    n = boxes.shape[0]
    order = torch.topk(scores, n).indices
    ranked = boxes[order]
    iou = box_iou(ranked, ranked)
    rank = torch.arange(n, device=boxes.device)
    above = rank.view(-1, 1) < rank.view(1, -1)  # j ranks above i (no Trilu: not every builder has it)
    keep = _settle()(torch.logical_and(iou > iou_threshold, above))
    kept_scores = scores[order] * keep.to(scores.dtype)
    scores[order] = kept_scores  # the caller reads its scores again: suppressed boxes score 0
    return order[torch.topk(kept_scores, n).indices]


@contextlib.contextmanager
def torchvision_nms_as_greedy_graph():
    """Within the block, ``torchvision.ops.nms`` is :func:`greedy_nms` (Ultralytics' NMS wrapper
    imports it when it runs)."""
    from unittest import mock

    import torchvision.ops

    with mock.patch.object(torchvision.ops, "nms", greedy_nms):
        yield

