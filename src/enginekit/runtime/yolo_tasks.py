"""Pre- and postprocessing of the YOLO tasks beyond detection, as Ultralytics' own predictors do them.

Segment, pose and obb letterbox like the detector (``YoloProcessor``) and follow
``ultralytics/models/yolo/{segment,pose,obb}/predict.py`` after the network: NMS with the class
count (and ``rotated`` for obb), then ``scale_boxes``; masks by ``process_mask_native`` at the
original resolution (Ultralytics' ``retina_masks`` path), keypoints by ``scale_coords``, rotated
boxes scaled as centre + size with their angle kept. Classify preprocesses with
``classify_transforms`` (shorter side resized, centre crop) and reads the probabilities the
exported head computes. RT-DETR stretches the image to the network's size (``scale_fill``, no
letterbox) and follows ``ultralytics/models/rtdetr/predict.py``: its decoder's top-k rows (centre +
size in 0..1) kept above conf, ``xywh2xyxy``, then scaled by the original width and height.
Semantic letterboxes like the detector and follows ``ultralytics/models/yolo/semantic/predict.py``:
logits to the input's size, ``scale_masks`` to the original (padding removed), argmax. YOLO depth
stretches like RT-DETR and follows ``ultralytics/models/yolo/depth/predict.py``: the map to the
input's size, then to the original, bilinear with ``align_corners=True``.
"""

from __future__ import annotations

import ast

import numpy as np

from enginekit.runtime.results import Classification, DepthMap, Detections, OrientedBoxes, Poses, SemanticMap, Segments
from enginekit.runtime.yolo import YoloProcessor, network_hw

TOP_K = 5


def _numpy(t, dtype=np.float32) -> np.ndarray:
    return t.cpu().numpy().astype(dtype, copy=False)


class _TaskProcessor(YoloProcessor):
    def names_of(self, ids: np.ndarray) -> list[str]:
        return [self.names.get(int(i), str(int(i))) for i in ids]

    @property
    def nc(self) -> int:
        """The class count NMS needs to tell class scores from the task's channels after them."""
        if not self.names and not self.end2end:
            from enginekit.errors import UsageError

            raise UsageError(f"the {self.family} graph does not name its classes (no 'names' metadata): "
                             "its class scores cannot be told from its other channels")
        return len(self.names)


class SegmentProcessor(_TaskProcessor):
    """Boxes + instance masks (N x H x W bool at the original resolution)."""

    family = "yolo-seg"

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[Segments]:
        from ultralytics.utils import ops

        protos = self.output(outputs, 1)
        kept = self.nms(self.output(outputs, 0), nc=self.nc)
        results = []
        for det, proto, shape in zip(kept, protos, image_hws):
            shape = tuple(shape)
            if not len(det):
                results.append(Segments(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64),
                                        [], shape, masks=np.zeros((0, *shape), bool)))
                continue
            boxes = ops.scale_boxes(hw, det[:, :4].clone(), shape)
            masks = ops.process_mask_native(proto, det[:, 6:], boxes, shape)
            keep = masks.amax((-2, -1)) > 0  # as Ultralytics: only detections with a mask
            det, boxes, masks = det[keep], boxes[keep], masks[keep]
            ids = _numpy(det[:, 5], np.int64)
            results.append(Segments(_numpy(boxes), _numpy(det[:, 4]), ids, self.names_of(ids), shape,
                                    masks=masks.cpu().numpy().view(np.bool_)))  # 0/1 uint8: no copy
        return results


class PoseProcessor(_TaskProcessor):
    """Boxes + keypoints (N x K x 3: x, y in original pixels, visibility; or N x K x 2)."""

    family = "yolo-pose"

    def __init__(self, adapter, metadata: dict, info, **options):
        super().__init__(adapter, metadata, info, **options)
        raw = metadata.get("kpt_shape") or "[17, 3]"
        self.kpt_shape = tuple(ast.literal_eval(raw) if isinstance(raw, str) else raw)

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[Poses]:
        from ultralytics.utils import ops

        kept = self.nms(self.output(outputs, 0), nc=self.nc)
        results = []
        for det, shape in zip(kept, image_hws):
            shape = tuple(shape)
            boxes = ops.scale_boxes(hw, det[:, :4].clone(), shape) if len(det) else det[:, :4]
            kpts = det[:, 6:].reshape(det.shape[0], *self.kpt_shape)
            kpts = ops.scale_coords(hw, kpts.clone(), shape) if len(det) else kpts
            ids = _numpy(det[:, 5], np.int64)
            results.append(Poses(_numpy(boxes), _numpy(det[:, 4]), ids, self.names_of(ids), shape,
                                 keypoints=_numpy(kpts)))
        return results


class ObbProcessor(_TaskProcessor):
    """Rotated boxes: xywhr in original pixels (angle in radians, as Ultralytics' ``OBB.xywhr``)."""

    family = "yolo-obb"

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[OrientedBoxes]:
        import torch
        from ultralytics.utils import ops

        kept = self.nms(self.output(outputs, 0), nc=self.nc, rotated=True)
        results = []
        for det, shape in zip(kept, image_hws):
            shape = tuple(shape)
            rboxes = torch.cat([det[:, :4], det[:, -1:]], dim=-1)
            if len(det):
                rboxes[:, :4] = ops.scale_boxes(hw, rboxes[:, :4], shape, xywh=True)
            ids = _numpy(det[:, 5], np.int64)
            results.append(OrientedBoxes(_numpy(rboxes).reshape(-1, 5), _numpy(det[:, 4]), ids, self.names_of(ids),
                                         shape))
        return results


class ClassifyProcessor:
    """Top-k classes from the probabilities the exported ``Classify`` head computes (softmax)."""

    family = "yolo-cls"

    def __init__(self, adapter, metadata: dict, info, *, input_size=None, top_k: int = TOP_K, **_):
        from enginekit.runtime.yolo import parse_names

        self.adapter = adapter
        self.info = info
        self.names = parse_names(metadata.get("names"))
        self.top_k = top_k
        self.hw = network_hw(adapter, info, input_size)
        self._gpu_transforms = None

    def input_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        return self.hw

    def preprocess_cpu(self, rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        return self.adapter.preprocess(rgb, hw)[0]

    def preprocess_gpu(self, chw, hw: tuple[int, int]):
        """The same ``classify_transforms`` on a 3xHxW float RGB tensor (0..255): resize (antialiased
        bilinear) and centre crop on the GPU, then to 0..1 and normalised."""
        if self._gpu_transforms is None:
            from ultralytics.data.augment import classify_transforms

            resize, crop, _, normalize = classify_transforms(hw if hw[0] != hw[1] else hw[0]).transforms
            self._gpu_transforms = (resize, crop, normalize)
        resize, crop, normalize = self._gpu_transforms
        x = crop(resize(chw)).clamp_(0, 255).mul_(1.0 / 255.0)
        return normalize(x)

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[Classification]:
        probs = outputs[self.info.output_names[0]]
        probs = probs.float().cpu().numpy() if not isinstance(probs, np.ndarray) else probs.astype(np.float32)
        results = []
        for p, shape in zip(probs.reshape(len(image_hws), -1), image_hws):
            top = np.argsort(-p, kind="stable")[: self.top_k]
            results.append(Classification(top.astype(np.int64), p[top], [self.names.get(int(i), str(int(i)))
                                                                        for i in top], p, tuple(shape)))
        return results


class _StretchedInput(YoloProcessor):
    """The image stretched to the network's size (Ultralytics' ``scale_fill``), no letterbox."""

    def preprocess_gpu(self, chw, hw: tuple[int, int]):
        """``chw``: 3xHxW float32 RGB in 0..255 on the GPU -> 3xhxw stretched to ``hw`` in 0..1 (scale_fill)."""
        import torch.nn.functional as F

        x = chw[None]
        if tuple(chw.shape[1:]) != tuple(hw):
            x = F.interpolate(x, size=tuple(hw), mode="bilinear", align_corners=False)
        return x[0].mul_(1.0 / 255.0)


class RtdetrProcessor(_StretchedInput):
    """RT-DETR's kept rows (no NMS: the decoder's top-k), boxes in the original image's pixels."""

    family = "rtdetr"

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[Detections]:
        from ultralytics.utils import ops

        results = []
        for rows, shape in zip(self.output(outputs, 0), image_hws):
            keep = rows[:, 4] > self.conf  # as RTDETRPredictor: strictly above conf, in the decoder's order
            det = rows[keep][: self.max_det]
            boxes = ops.xywh2xyxy(det[:, :4])
            boxes[:, [0, 2]] *= shape[1]
            boxes[:, [1, 3]] *= shape[0]
            ids = _numpy(det[:, 5], np.int64)
            results.append(Detections(_numpy(boxes), _numpy(det[:, 4]), ids, self.names_of(ids), tuple(shape)))
        return results

    def names_of(self, ids: np.ndarray) -> list[str]:
        return [self.names.get(int(i), str(int(i))) for i in ids]


class SemanticProcessor(YoloProcessor):
    """A class id per pixel at the original resolution, from the exported logits (B, nc, H, W)."""

    family = "yolo-sem"

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[SemanticMap]:
        import torch.nn.functional as F
        from ultralytics.utils import ops

        results = []
        for logits, shape in zip(self.output(outputs, 0), image_hws):
            pred = logits[None]
            if tuple(pred.shape[2:]) != tuple(hw):
                pred = F.interpolate(pred, size=tuple(hw), mode="bilinear", align_corners=False)
            pred = ops.scale_masks(pred, tuple(shape))[0]  # letterbox padding removed, to the original size
            class_map = pred.argmax(0) if pred.shape[0] > 1 else pred.gt(0)[0]
            results.append(SemanticMap(_numpy(class_map, np.uint8 if pred.shape[0] <= 256 else np.int32),
                                       dict(self.names), tuple(shape)))
        return results


class YoloDepthProcessor(_StretchedInput):
    """The depth map at the original resolution (the image stretched to the network's size, as Ultralytics)."""

    family = "yolo-depth"

    def postprocess(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]) -> list[DepthMap]:
        import torch.nn.functional as F

        depth = self.output(outputs, 0)
        if depth.dim() == 3:
            depth = depth[:, None]
        depth = F.interpolate(depth, size=tuple(hw), mode="bilinear", align_corners=True)
        return [DepthMap(_numpy(F.interpolate(d[None], size=tuple(shape), mode="bilinear", align_corners=True)[0, 0]),
                         tuple(shape)) for d, shape in zip(depth, image_hws)]
