"""Runtime pre/postprocessing of declared PyTorch models: the declared preprocessing, results by task.

The CPU path is the adapter's own ``preprocess`` (what parity was measured on); the GPU path does the
same on the device: channel order, ``stretch``/``letterbox``/``crop`` (:func:`geometry`), /255, mean and
std. Results are in the original image's pixels: a class map at the frame's size (the letterbox's grey
bars cut off first), top-k classes (softmax of logits), a depth map at the frame's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enginekit.families.processing import DepthMaps, ImageProcessor, SemanticMaps, TopClasses
from enginekit.results import DepthMap, SemanticMap

PAD = 114  # letterbox bars, as Ultralytics pads


@dataclass(frozen=True)
class Geometry:
    """Where an image lands in the network's input: resized to (rh, rw), then its (top, left) corner at
    (y, x) of the input (negative: cropped)."""

    rh: int
    rw: int
    y: int
    x: int


def geometry(image_hw: tuple[int, int], hw: tuple[int, int], resize: str, crop_fraction: float = 0.875) -> Geometry:
    h0, w0 = image_hw
    h, w = hw
    if resize == "letterbox":
        r = min(h / h0, w / w0)
        rh, rw = max(1, round(h0 * r)), max(1, round(w0 * r))
        return Geometry(rh, rw, (h - rh) // 2, (w - rw) // 2)
    if resize == "crop":  # the shorter side to side / crop_fraction, then the centre h x w
        r = max(h / h0, w / w0) / crop_fraction
        rh, rw = max(h, round(h0 * r)), max(w, round(w0 * r))
        return Geometry(rh, rw, -((rh - h) // 2), -((rw - w) // 2))
    return Geometry(h, w, 0, 0)


def place(img: np.ndarray, hw: tuple[int, int], resize: str, crop_fraction: float = 0.875) -> np.ndarray:
    """HxWx3 uint8 -> hxwx3 uint8, resized (bilinear) and placed as ``resize`` says."""
    import cv2

    h, w = hw
    g = geometry(img.shape[:2], hw, resize, crop_fraction)
    resized = img if (g.rh, g.rw) == img.shape[:2] else cv2.resize(img, (g.rw, g.rh), interpolation=cv2.INTER_LINEAR)
    if resize == "letterbox":
        out = np.full((h, w, 3), PAD, np.uint8)
        out[g.y:g.y + g.rh, g.x:g.x + g.rw] = resized
        return out
    if resize == "crop":
        return np.ascontiguousarray(resized[-g.y:-g.y + h, -g.x:-g.x + w])
    return resized


class DeclaredInput(ImageProcessor):
    """The declared preprocessing on the GPU, as ``TorchModelAdapter.preprocess`` does it on the CPU."""

    def __init__(self, adapter, metadata: dict, info, *, input_size=None, **kw):
        super().__init__(adapter, metadata, info, input_size=input_size, **kw)
        spec = adapter.spec
        self.resize = spec.resize or "stretch"
        self.bgr = spec.channels == "bgr"
        if spec.mean is not None or spec.std is not None:
            self.mean, self.std = spec.mean or (0.0, 0.0, 0.0), spec.std or (1.0, 1.0, 1.0)
        self.crop_fraction = adapter.crop_fraction
        if not self.names:
            self.names = adapter.default_class_names()

    def preprocess_gpu(self, chw, hw):
        import torch
        import torch.nn.functional as F

        if self.resize == "stretch":
            return ImageProcessor.preprocess_gpu(self, chw.flip(0) if self.bgr else chw, hw)
        g = geometry(tuple(chw.shape[1:]), hw, self.resize, self.crop_fraction)
        x = (chw.flip(0) if self.bgr else chw)[None]
        x = F.interpolate(x, size=(g.rh, g.rw), mode="bilinear", align_corners=False)[0]
        h, w = hw
        if self.resize == "letterbox":
            out = torch.full((3, h, w), float(PAD), device=x.device, dtype=x.dtype)
            out[:, g.y:g.y + g.rh, g.x:g.x + g.rw] = x
        else:
            out = x[:, -g.y:-g.y + h, -g.x:-g.x + w]
        out = out.mul(1.0 / 255.0)
        if self.mean is None:
            return out.contiguous()
        key = (out.device, out.dtype)
        if key not in self._norm:  # made once: a host-to-device copy cannot be captured in a CUDA graph
            self._norm[key] = tuple(torch.tensor(v, device=out.device, dtype=out.dtype).view(3, 1, 1)
                                    for v in (self.mean, self.std))
        mean, std = self._norm[key]
        return ((out - mean) / std).contiguous()

    def covered(self, maps, image_hw, hw):
        """The part of network-sized maps (N, C, h, w) that shows the image (letterbox bars cut off)."""
        g = geometry(image_hw, hw, self.resize, self.crop_fraction)
        if self.resize == "letterbox":
            return maps[..., g.y:g.y + g.rh, g.x:g.x + g.rw]
        return maps


class SemanticProcessor(DeclaredInput, SemanticMaps):
    """A class per pixel at the frame's size: logits to the network's size, bars cut off, to the frame's."""

    def postprocess(self, outputs, image_hws, hw):
        results = []
        for logits, shape in zip(self.output(outputs, 0), image_hws):
            class_map = frame_class_map(logits, tuple(shape), hw, self.resize, self.crop_fraction)
            dtype = np.uint8 if logits.shape[0] <= 256 else np.int32
            results.append(SemanticMap(class_map.cpu().numpy().astype(dtype), dict(self.names), tuple(shape)))
        return results


def frame_class_map(logits, image_hw: tuple[int, int], hw: tuple[int, int], resize: str,
                    crop_fraction: float = 0.875):
    """Per-pixel logits (C, h, w) of one frame -> its class map at the frame's size (``image_hw``): the logits
    bilinear to the network's size ``hw``, the letterbox's bars cut off, bilinear to the frame's size, then the
    argmax (logit > 0 for one class). A tensor in, a tensor out (numpy in: numpy out). The runtime's result,
    and what ``verify --data`` scores against labels, for the FP32 model and every graph alike."""
    import torch
    import torch.nn.functional as F

    array = isinstance(logits, np.ndarray)
    t = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32)) if array else logits
    full = t[None].float()
    if tuple(full.shape[2:]) != tuple(hw):
        full = F.interpolate(full, size=tuple(hw), mode="bilinear", align_corners=False)
    if resize == "letterbox":
        g = geometry(tuple(image_hw), tuple(hw), resize, crop_fraction)
        full = full[..., g.y:g.y + g.rh, g.x:g.x + g.rw]
    pred = full if tuple(full.shape[2:]) == tuple(image_hw) else F.interpolate(
        full, size=tuple(image_hw), mode="bilinear", align_corners=False)
    class_map = pred[0].argmax(0) if pred.shape[1] > 1 else pred[0].gt(0)[0].long()
    return class_map.numpy() if array else class_map


class ClassifyProcessor(DeclaredInput, TopClasses):
    """The top-5 classes; declared logits become probabilities by softmax first."""

    def postprocess(self, outputs, image_hws, hw):
        name = self.info.output_names[0]
        if self.adapter.meanings.get(self.adapter.output_names[0]) == "logits":
            values = self.output(outputs, 0).reshape(len(image_hws), -1)
            outputs = {**outputs, name: values.softmax(1)}
        return TopClasses.postprocess(self, outputs, image_hws, hw)


class DepthProcessor(DeclaredInput, DepthMaps):
    """A depth map at the frame's size (letterbox bars cut off first)."""

    def postprocess(self, outputs, image_hws, hw):
        import torch.nn.functional as F

        depth = self.output(outputs, 0)
        if depth.dim() == 3:
            depth = depth[:, None]
        depth = F.interpolate(depth, size=tuple(hw), mode="bilinear", align_corners=True)
        results = []
        for d, shape in zip(depth, image_hws):
            part = self.covered(d[None], tuple(shape), hw)
            m = F.interpolate(part, size=tuple(shape), mode="bilinear", align_corners=True)[0, 0]
            results.append(DepthMap(m, tuple(shape)))  # on its device until read as NumPy
        return results
