"""YOLO pre- and postprocessing, as Ultralytics' own predictor does it.

CPU: the adapter's preprocessing (Ultralytics ``LetterBox``, auto=False, gray 114) on numpy.
GPU: the same letterbox with torch ops on the predictor's stream (bilinear resize, as
cv2.INTER_LINEAR; pixel values may differ by one grey level from cv2's fixed-point rounding).
Postprocessing: ``ultralytics.utils.nms.non_max_suppression`` (or the end-to-end head's top-k,
which that function handles with ``end2end=True``) and ``ultralytics.utils.ops.scale_boxes``.
"""

from __future__ import annotations

import ast

import numpy as np

from enginekit.runtime.results import Detections


def letterbox_geometry(shape: tuple[int, int], new: tuple[int, int]) -> tuple[tuple[int, int], int, int, int, int]:
    """Ultralytics LetterBox(auto=False, scaleup=True, center=True): resized (h, w) and the padding."""
    h, w = shape
    r = min(new[0] / h, new[1] / w)
    unpad_w, unpad_h = int(round(w * r)), int(round(h * r))
    dw, dh = (new[1] - unpad_w) / 2, (new[0] - unpad_h) / 2
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    return (unpad_h, unpad_w), top, bottom, left, right


def parse_names(value) -> dict[int, str]:
    if isinstance(value, dict):
        return {int(k): str(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return dict(enumerate(map(str, value)))
    if isinstance(value, str) and value:
        try:
            return parse_names(ast.literal_eval(value))
        except (ValueError, SyntaxError):
            pass
    return {}


def network_hw(adapter, info, input_size) -> tuple[int, int]:
    """The network's H x W: the graph's fixed size, else ``input_size`` (int or (H, W)), else the family's."""
    fixed = info.fixed_hw
    if input_size is None:
        return fixed or tuple(adapter.default_input[2:])
    size = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    if fixed and tuple(size) != fixed:
        from enginekit.errors import UsageError

        raise UsageError(f"the model takes {fixed[0]}x{fixed[1]} inputs, not {size[0]}x{size[1]}")
    return tuple(size)


class YoloProcessor:
    family = "yolo"
    gpu_graphable = True  # preprocess_gpu launches only device work: the predictor may capture it

    def __init__(self, adapter, metadata: dict, info, *, conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
                 input_size=None, **_):
        self.adapter = adapter
        self.info = info
        self.names = parse_names(metadata.get("names"))
        self.end2end = str(metadata.get("end2end")) == "True"
        self.conf, self.iou, self.max_det = conf, iou, max_det
        self.hw = network_hw(adapter, info, input_size)

    def input_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        return self.hw

    def preprocess_cpu(self, rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        return self.adapter.preprocess(rgb, hw)[0]

    def preprocess_gpu(self, chw, hw: tuple[int, int]):
        """``chw``: 3xHxW float32 RGB in 0..255 on the GPU -> 3xhxw letterboxed in 0..1."""
        import torch
        import torch.nn.functional as F

        (uh, uw), top, bottom, left, right = letterbox_geometry(tuple(chw.shape[1:]), hw)
        x = chw[None]
        if (uh, uw) != tuple(chw.shape[1:]):
            x = F.interpolate(x, size=(uh, uw), mode="bilinear", align_corners=False)
        out = torch.full((1, 3, hw[0], hw[1]), 114.0, dtype=x.dtype, device=x.device)
        out[:, :, top:top + uh, left:left + uw] = x
        return out[0].mul_(1.0 / 255.0)

    def output(self, outputs: dict, index: int):
        """One output of the session as a float32 torch tensor (on the device it came from)."""
        import torch

        value = outputs[self.info.output_names[index]]
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        return value.float()

    def nms(self, pred, *, nc: int = 0, rotated: bool = False) -> list:
        """``ultralytics.utils.nms.non_max_suppression`` as Ultralytics' predictors call it, with no time limit:
        its default (2 s + 50 ms per image) stops early on a busy CPU and silently drops detections.
        torchvision is imported first: that function uses torchvision's NMS kernel only where it is imported,
        as it is in Ultralytics' own predictor, and falls back to a Python loop 100x slower on many boxes."""
        import torchvision  # noqa: F401
        from ultralytics.utils import nms

        return nms.non_max_suppression(pred, self.conf, self.iou, max_det=self.max_det, nc=nc, end2end=self.end2end,
                                       rotated=rotated, max_time_img=1e6)

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[Detections]:
        import torch
        from ultralytics.utils import ops

        kept = self.nms(self.output(outputs, 0))
        results = []
        for det, shape in zip(kept, image_hws):
            boxes = ops.scale_boxes(hw, det[:, :4].clone(), shape) if len(det) else det[:, :4]
            det = torch.cat([boxes, det[:, 4:6]], 1).cpu().numpy() if len(det) else np.zeros((0, 6), np.float32)
            ids = det[:, 5].astype(np.int64)
            results.append(Detections(det[:, :4].astype(np.float32), det[:, 4].astype(np.float32), ids,
                                      [self.names.get(int(i), str(int(i))) for i in ids], tuple(shape)))
        return results
