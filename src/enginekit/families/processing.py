"""Runtime pre/postprocessing by task, for any family (``families.interface.Processor``).

A processor takes frames to the network's input and the network's outputs to results
(``enginekit.results``) in the original image's pixels. The pieces here know no family:

- :class:`ImageProcessor`: the network's H x W, the CPU path through the family's own ``preprocess``
  (so the runtime feeds what parity was measured on), and the GPU path of a stretched input
  (bilinear resize to H x W, 0..1, then the family's mean/std where it declares them);
- postprocessing by task, mixed in: :class:`TopClasses` (classify), :class:`DepthMaps` (depth),
  :class:`SemanticMaps` (a class per pixel from per-pixel logits of a stretched input).

A family composes its processor from them (``class Tiny(SemanticMaps, ImageProcessor)``) or writes its own
(Ultralytics' letterbox and NMS, Depth-Anything's resize: their ``runtime`` modules).
"""

from __future__ import annotations

import ast
import re

import numpy as np

from enginekit.results import Classification, DepthMap, SemanticMap
from enginekit.errors import UsageError

TOP_K = 5


def parse_names(value) -> dict[int, str]:
    """Class names from a model's ``names`` (a dict, a list, or their text in ONNX metadata)."""
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


def network_hw(adapter, info, input_size, metadata: dict | None = None) -> tuple[int, int]:
    """The network's H x W: the graph's fixed size, else ``input_size`` (int or (H, W)), else the size a graph
    of dynamic H/W was exported at where its family letterboxes to it (``export_shape``), else the family's. A file
    whose writer records the size its own predictor runs it at (``runs_at``: an Ultralytics file of dynamic H/W)
    runs at that size."""
    fixed = info.fixed_hw
    if input_size is None:
        runs_at = str((metadata or {}).get("runs_at") or "")
        if not fixed and re.fullmatch(r"\d+x\d+", runs_at):
            return tuple(int(v) for v in runs_at.split("x"))
        exported = (metadata or {}).get("export_shape") if getattr(adapter, "export_at_profile_size", False) else None
        if not fixed and exported:
            return tuple(int(v) for v in str(exported).split("x")[2:4])
        return fixed or tuple(adapter.default_input[2:])
    size = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    if fixed and tuple(size) != fixed:
        raise UsageError(f"the model takes {fixed[0]}x{fixed[1]} inputs, not {size[0]}x{size[1]}")
    return tuple(size)


def output_tensor(outputs: dict, info, index: int):
    """One output of the session as a float32 torch tensor (on the device it came from)."""
    import torch

    value = outputs[info.output_names[index]]
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    return value.float()


class ImageProcessor:
    """Frames to the network's input at one H x W; subclasses add ``postprocess``."""

    gpu_graphable = True  # preprocess_gpu launches only device work (mean/std made once per device)
    #: per-channel mean and standard deviation of 0..1 RGB that the GPU path normalises with; None: 0..1 as is
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None

    def __init__(self, adapter, metadata: dict, info, *, input_size=None, **_):
        self.adapter = adapter
        self.info = info
        self.names = parse_names(metadata.get("names"))
        self.hw = network_hw(adapter, info, input_size, metadata)
        self._norm: dict = {}

    def input_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        return self.hw

    @property
    def input_note(self) -> str:
        """How frames become the network's input, for ``predictor.reason`` ("" where there is nothing to say)."""
        return ""

    def preprocess_cpu(self, rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        return self.adapter.preprocess(rgb, hw)[0]

    def host_step(self, frame_hw: tuple[int, int], hw: tuple[int, int]) -> bool:
        """Whether a frame goes through ``preprocess_host`` before it is uploaded to the GPU (here: never,
        the whole preprocessing runs on the device)."""
        return False

    def preprocess_host(self, frame: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        return frame

    def preprocess_gpu(self, chw, hw: tuple[int, int]):
        """``chw``: 3xHxW float32 RGB in 0..255 on the GPU -> 3xhxw stretched to ``hw``, 0..1, normalised."""
        import torch
        import torch.nn.functional as F

        x = chw[None]
        if tuple(chw.shape[1:]) != tuple(hw):
            x = F.interpolate(x, size=tuple(hw), mode="bilinear", align_corners=False)
        x = x[0].mul_(1.0 / 255.0)
        if self.mean is None:
            return x
        key = (x.device, x.dtype)
        if key not in self._norm:  # made here once: a host-to-device copy cannot be captured in a CUDA graph
            self._norm[key] = tuple(torch.tensor(v, device=x.device, dtype=x.dtype).view(3, 1, 1)
                                    for v in (self.mean, self.std))
        mean, std = self._norm[key]
        return (x - mean) / std

    def output(self, outputs: dict, index: int):
        return output_tensor(outputs, self.info, index)

    def names_of(self, ids: np.ndarray) -> list[str]:
        names = self.names
        return [names[i] if i in names else str(i) for i in np.asarray(ids).tolist()]


class TopClasses:
    """classify: the top-k classes of the probabilities (B, nc) in the first output."""

    top_k = TOP_K

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[Classification]:
        probs = outputs[self.info.output_names[0]]
        probs = probs.float().cpu().numpy() if not isinstance(probs, np.ndarray) else probs.astype(np.float32)
        results = []
        for p, shape in zip(probs.reshape(len(image_hws), -1), image_hws):
            top = np.argsort(-p, kind="stable")[: self.top_k]
            results.append(Classification(top.astype(np.int64), p[top], self.names_of(top), p, tuple(shape)))
        return results


class DepthMaps:
    """depth: the map ((B, H, W) or (B, 1, H, W)) to the input's size, then to the original image's,
    bilinear with ``align_corners=True``."""

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[DepthMap]:
        import torch.nn.functional as F

        depth = self.output(outputs, 0)
        if depth.dim() == 3:
            depth = depth[:, None]
        depth = F.interpolate(depth, size=tuple(hw), mode="bilinear", align_corners=True)
        # on the device that computed it: copied to the host when read as NumPy (DepthMap.depth)
        return [DepthMap(F.interpolate(d[None], size=tuple(shape), mode="bilinear", align_corners=True)[0, 0],
                         tuple(shape)) for d, shape in zip(depth, image_hws)]


class SemanticMaps:
    """semantic, of a stretched input: per-pixel logits (B, nc, h, w) to the original image's size
    (bilinear), then a class per pixel (argmax; logit > 0 for one class)."""

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[SemanticMap]:
        import torch.nn.functional as F

        results = []
        for logits, shape in zip(self.output(outputs, 0), image_hws):
            pred = F.interpolate(logits[None], size=tuple(shape), mode="bilinear", align_corners=False)[0]
            class_map = pred.argmax(0) if pred.shape[0] > 1 else pred.gt(0)[0]
            results.append(SemanticMap(class_map.cpu().numpy().astype(np.uint8 if pred.shape[0] <= 256 else np.int32),
                                       dict(self.names), tuple(shape)))
        return results
