"""Depth-Anything-V2 pre- and postprocessing, as its reference pipeline does it.

The image is resized (bicubic, keeping its aspect ratio) so both sides reach ``input_size``
(518 by default) and are multiples of 14 (the original repository's ``lower_bound`` resize),
scaled to 0..1 and normalised with ImageNet's mean and std; the depth map is resized back to
the original H x W (bilinear, align_corners=True, as the original ``infer_image`` does).
A model with fixed H/W gets exactly that size.
"""

from __future__ import annotations

import math

import numpy as np

from enginekit.results import DepthMap

PATCH = 14
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def lower_bound_size(h: int, w: int, size: int = 518, multiple: int = PATCH) -> tuple[int, int]:
    """The original repository's Resize(keep_aspect_ratio, ensure_multiple_of=14, 'lower_bound')."""
    scale = max(size / h, size / w)

    def constrain(x: float) -> int:
        y = int(round(x / multiple) * multiple)
        if y < size:
            y = int(math.ceil(x / multiple) * multiple)
        return y

    return constrain(scale * h), constrain(scale * w)


class DepthProcessor:
    """Depth-Anything-V2's processor (``families.interface.Processor``)."""

    gpu_graphable = True  # preprocess_gpu launches only device work (mean/std made once per device)

    def __init__(self, adapter, metadata: dict, info, *, input_size=None, **_):
        self.adapter = adapter
        self.info = info
        self.fixed = info.fixed_hw
        if isinstance(input_size, (tuple, list)):
            self.fixed = tuple(input_size)
            input_size = None
        # any fixed H x W is served: the graph resizes a side that is not a multiple of 14 itself
        self.size = int(input_size or 518)
        self._norm: dict = {}

    def input_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        return self.fixed or lower_bound_size(*image_hw, self.size)

    def preprocess_cpu(self, rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        return self.adapter.preprocess(rgb, hw)[0]

    def preprocess_gpu(self, chw, hw: tuple[int, int]):
        import torch
        import torch.nn.functional as F

        x = chw[None]
        if tuple(x.shape[2:]) != tuple(hw):
            x = F.interpolate(x, size=hw, mode="bicubic", align_corners=False).clamp_(0, 255)
        key = (x.device, x.dtype)
        if key not in self._norm:  # made here once: a host-to-device copy cannot be captured in a CUDA graph
            self._norm[key] = tuple(torch.tensor(v, device=x.device, dtype=x.dtype).view(1, 3, 1, 1) * 255.0
                                    for v in (MEAN, STD))
        mean, std = self._norm[key]
        return ((x - mean) / std)[0]

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[DepthMap]:
        import torch
        import torch.nn.functional as F

        depth = outputs[self.info.output_names[0]]
        if isinstance(depth, np.ndarray):
            depth = torch.from_numpy(depth)
        depth = depth.float()
        if depth.dim() == 4:
            depth = depth[:, 0]
        results = []
        for d, shape in zip(depth, image_hws):
            full = F.interpolate(d[None, None], size=tuple(shape), mode="bilinear", align_corners=True)[0, 0]
            results.append(DepthMap(full, tuple(shape)))  # on its device until read as NumPy
        return results
