"""Pre- and postprocessing of Ultralytics models at runtime, as Ultralytics' own predictors do them.

Letterbox (detect, segment, pose, obb, semantic): Ultralytics' own ``LetterBox`` (OpenCV, on the uint8 frame,
gray 114) on the host for a session on the CPU, as ``BasePredictor.pre_transform`` does; for a session on a GPU the
whole uint8 frame is uploaded and letterboxed there with OpenCV's own fixed-point arithmetic
(``enginekit.exact_resize``: the same bytes). Then only exact steps: HWC to CHW, BGR to RGB, to float and ``/ 255``
(numpy on the CPU; torch on the device, as ``BasePredictor.preprocess``). The input is the tensor
``YOLO(pt).predict`` builds, bit for bit, on either path (``gpu_letterbox`` is kept as a no-op: the GPU path is
exact). RT-DETR and depth: stretched (``LetterBox(scale_fill=True)``) on the host. Classify: ``classify_transforms`` (on the GPU: torchvision's on the device). After
the network each task follows ``ultralytics/models/.../predict.py``:

- detect: ``ultralytics.utils.nms.non_max_suppression`` (or the end-to-end head's top-k, which that function
  handles with ``end2end=True``) and ``ultralytics.utils.ops.scale_boxes``;
- segment, pose, obb: NMS with the class count (and ``rotated`` for obb), then ``scale_boxes``; masks by
  ``process_mask_native`` at the original resolution (Ultralytics' ``retina_masks`` path), keypoints by
  ``scale_coords``, rotated boxes scaled as centre + size with their angle kept;
- classify: ``classify_transforms`` (shorter side resized, centre crop), the probabilities the exported
  head computes, top-k;
- RT-DETR: the image stretched to the network's size (``scale_fill``, no letterbox); its decoder's top-k
  rows (centre + size in 0..1) kept above conf, ``xywh2xyxy``, then scaled by the original width and height;
- semantic: letterboxed like the detector; logits to the input's size, ``scale_masks`` to the original
  (padding removed), argmax;
- depth: stretched like RT-DETR; the map to the input's size, then to the original, bilinear with
  ``align_corners=True``.
"""

from __future__ import annotations

import ast

import numpy as np

from enginekit.families.processing import DepthMaps, ImageProcessor, TopClasses
from enginekit.results import Detections, OrientedBoxes, Poses, SemanticMap, Segments
from enginekit.errors import UsageError


def ultralytics_nms():
    """``ultralytics.utils.nms.non_max_suppression``, with torchvision imported first: that function runs
    torchvision's NMS kernel only where torchvision is already imported (as in Ultralytics' own predictor), and
    otherwise a Python loop, 10-100x slower on many candidate boxes (verify's labels decode thousands per image at
    the validator's conf 0.001). Every caller in enginekit takes it from here."""
    import torchvision  # noqa: F401
    from ultralytics.utils.nms import non_max_suppression

    return non_max_suppression


def kept_rows(pred, conf: float, iou: float, *, max_det: int = 300, nc: int = 0, max_nms: int = 30000,
              max_wh: int = 7680) -> list:
    """Ultralytics' ``non_max_suppression`` for axis-aligned boxes as its predictors call it (best class per box,
    class-aware, no class filter): the same candidates in the same order, the same arithmetic (``xywh2xyxy``, class
    offsets of ``max_wh``, torchvision's NMS), so the same rows, (N, 6 + extra) x1 y1 x2 y2 score class extra.

    On a GPU it waits on the device twice per image (the candidates' count, torchvision's NMS) where Ultralytics'
    function waits on each boolean selection and re-concatenates the whole candidate table; every step stays on
    the device that ran the network, and the kept rows are the only thing the caller copies out."""
    import torch
    import torchvision
    from ultralytics.utils.ops import xywh2xyxy

    nc = nc or (pred.shape[1] - 4)
    out = []
    for x in pred.transpose(-1, -2):  # (anchors, 4 + nc + extra) per image
        score, cls = x[:, 4:4 + nc].max(1)
        index = (score > conf).nonzero().view(-1)  # in anchor order, as Ultralytics' boolean selection
        if not len(index):
            out.append(x.new_zeros((0, x.shape[1] - nc + 2)))
            continue
        if len(index) > max_nms:  # as Ultralytics: the highest scores first
            index = index[score[index].argsort(descending=True)[:max_nms]]
        rows = torch.cat((xywh2xyxy(x[index, :4]), score[index, None], cls[index, None].float(), x[index, 4 + nc:]), 1)
        keep = torchvision.ops.nms(rows[:, :4] + rows[:, 5:6] * max_wh, rows[:, 4], iou)[:max_det]
        out.append(rows[keep])
    return out


def letterbox(new_shape: tuple[int, int], *, auto: bool = False, stride: int = 32):
    """Ultralytics' ``LetterBox`` as its predictor makes it (scaleup, centred, gray 114): ``auto`` for the
    smallest stride-aligned rectangle around the frame (``.pt`` predict), else the full ``new_shape``."""
    from ultralytics.data.augment import LetterBox

    return LetterBox(new_shape=tuple(new_shape), auto=auto, scaleup=True, center=True, stride=stride)


def to_input(boxed: np.ndarray) -> np.ndarray:
    """A letterboxed HxWx3 uint8 frame -> 3xHxW float32 in 0..1 (channels kept), as Ultralytics' predictor."""
    return np.ascontiguousarray(boxed.transpose(2, 0, 1), dtype=np.float32) / 255.0


def stretch(new_shape: tuple[int, int]):
    """Ultralytics' ``LetterBox(scale_fill=True)``: the frame resized to ``new_shape``, no padding, as its
    RT-DETR and depth predictors."""
    from ultralytics.data.augment import LetterBox

    return LetterBox(new_shape=tuple(new_shape), auto=False, scale_fill=True)


def letterbox_params(shape: tuple[int, int], new_shape: tuple[int, int], *, auto: bool = False,
                     stride: int = 32) -> dict:
    """``LetterBox.get_params`` for a frame of H x W ``shape``: resized size (``new_unpad``, w h) and padding."""
    return letterbox(new_shape, auto=auto, stride=stride).get_params(
        {"img": np.broadcast_to(np.zeros((), np.uint8), (*shape, 1))})


def letterbox_geometry(shape: tuple[int, int], new: tuple[int, int], *, auto: bool = False,
                       stride: int = 32) -> tuple[tuple[int, int], int, int, int, int]:
    """Ultralytics LetterBox (scaleup, centred; ``auto``: the smallest rectangle): resized (h, w) and the padding."""
    p = letterbox_params(shape, new, auto=auto, stride=stride)
    return (p["new_unpad"][1], p["new_unpad"][0]), p["top"], p["bottom"], p["left"], p["right"]


def letterboxed_hw(shape: tuple[int, int], new: tuple[int, int], *, auto: bool = False,
                   stride: int = 32) -> tuple[int, int]:
    """The H x W a frame of ``shape`` is letterboxed to."""
    (uh, uw), top, bottom, left, right = letterbox_geometry(shape, new, auto=auto, stride=stride)
    return uh + top + bottom, uw + left + right


class YoloProcessor(ImageProcessor):
    """Detections: letterboxed input, Ultralytics' NMS, boxes in the original image's pixels.

    Letterbox: where the session takes it (a graph of dynamic H/W, an engine whose profiles cover it), each
    frame goes to the smallest stride-aligned rectangle around it, as ``YOLO(pt).predict`` letterboxes
    (``LetterBox(auto=True)``: 640x480 for a 4:3 frame at 640); else to the full network size (square),
    which gives other boxes on a frame that is not square. ``input_note`` says which, and why."""

    gpu_graphable = True  # preprocess_gpu launches only device work: the predictor may capture it
    #: preprocess_gpu treats the three channels alike (resize, grey padding, / 255): the predictor may swap BGR
    #: to RGB after it, on the small input rather than the whole frame
    channel_wise = True
    #: the family letterboxes as Ultralytics' predictor (RT-DETR stretches instead: no rectangle)
    rect = True

    def __init__(self, adapter, metadata: dict, info, *, conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
                 input_size=None, gpu_letterbox: bool = False, **_):
        super().__init__(adapter, metadata, info, input_size=input_size)
        #: kept for callers: a GPU session always letterboxes on the GPU, exactly as OpenCV (``preprocess_gpu``)
        self.gpu_letterbox = bool(gpu_letterbox)
        self.end2end = str(metadata.get("end2end")) == "True"
        self.conf, self.iou, self.max_det = conf, iou, max_det
        self.stride = int(metadata.get("stride") or 32)
        self._input_hws: dict[tuple, tuple] = {}
        self._letterboxes: dict[tuple, object] = {}
        self._kernel_tables: dict[tuple, list] = {}

    def rect_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        """The smallest stride-aligned rectangle ``YOLO(pt).predict`` letterboxes a frame of ``image_hw`` to."""
        return letterboxed_hw(tuple(image_hw), self.hw, auto=True, stride=self.stride)

    def input_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        key = tuple(image_hw)
        hw = self._input_hws.get(key)
        if hw is None:  # asked for every frame (a camera's repeat their shape): worked out once per shape
            hw = self._input_hws[key] = self._input_hw(key)
        return hw

    def _input_hw(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        if self.rect and self.adapter.rect_hw(tuple(image_hw), tuple(self.hw)) is not None:
            hw = self.rect_hw(image_hw)
            if hw != tuple(self.hw) and self.info.accepts_hw(hw):
                return hw
        return tuple(self.hw)

    @property
    def input_note(self) -> str:
        notes = [n for n in (self._shape_note, self._resize_note) if n]
        return "; ".join(notes)

    @property
    def _resize_note(self) -> str:
        if not self.info.on_gpu:
            return ""
        return "frames letterboxed on the GPU with OpenCV's arithmetic (the bytes YOLO(pt).predict gets)"

    @property
    def _shape_note(self) -> str:
        if not self.rect or self.adapter.rect_hw(tuple(self.hw), tuple(self.hw)) is None:
            return ""
        h, w = self.hw
        probe = self.rect_hw((h * 3, w * 4)) if w >= h else self.rect_hw((h * 4, w * 3))  # a 4:3 frame
        if self.info.accepts_hw(probe):
            # the rectangles of the two common frame shapes, landscape (portrait frames: the same, turned)
            wide, four = self.rect_hw((720, 1280)), self.rect_hw((480, 640))
            return (f"letterbox as YOLO(pt).predict: each frame to the smallest {self.stride}-aligned rectangle at "
                    f"{h}x{w} (16:9 frames: {wide[0]}x{wide[1]}, 4:3 frames: {four[0]}x{four[1]})")
        what = "its engine's profiles take" if self.info.profiles else "the graph's input is fixed at"
        fix = (f"build with a --profile covering the frames' rectangle (e.g. 1x3x{probe[0]}x{probe[1]})"
               if self.info.profiles else "export it with dynamic H/W (enginekit export does for YOLO)")
        return (f"letterbox to {h}x{w} (square), not YOLO(pt).predict's rectangle: {what} "
                f"{'x'.join(map(str, self.info.fixed_hw or self.hw))} only; boxes on a non-square frame differ from "
                f"the .pt's: {fix}")

    def letterbox_for(self, image_hw: tuple[int, int], hw: tuple[int, int]):
        """The ``LetterBox`` that takes a frame of ``image_hw`` to the network input ``hw`` (``input_hw``'s)."""
        key = tuple(hw)
        box = self._letterboxes.get(key)
        if box is None:  # made once per input size (it keeps no frame's state)
            rect = key != tuple(self.hw)  # the frame's rectangle
            box = self._letterboxes[key] = letterbox(self.hw, auto=True, stride=self.stride) if rect else letterbox(hw)
        return box

    def host_step(self, frame_hw: tuple[int, int], hw: tuple[int, int]) -> bool:
        """Whether a frame of ``frame_hw`` is letterboxed on the host before it goes to the GPU: never. The GPU
        letterboxes it itself with OpenCV's arithmetic (``enginekit.exact_resize``: the bytes ``cv2.resize`` and
        Ultralytics' padding give), so the frame goes up whole and the fast path is the exact one."""
        return False

    def preprocess_host(self, frame: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        """An HxWx3 uint8 frame (RGB or BGR: OpenCV resizes each channel alike) letterboxed to the network
        input ``hw`` (``input_hw``'s), uint8: Ultralytics' ``LetterBox``, as its predictor's ``pre_transform``."""
        boxed = self.letterbox_for(frame.shape[:2], hw)(image=frame)
        if boxed.shape[:2] != tuple(hw):
            raise ValueError(f"a {frame.shape[0]}x{frame.shape[1]} frame letterboxes to {boxed.shape[0]}x"
                             f"{boxed.shape[1]}, not {hw[0]}x{hw[1]}")
        return boxed

    def preprocess_cpu(self, rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        return to_input(self.preprocess_host(rgb, hw))

    def preprocess_gpu(self, chw, hw: tuple[int, int]):
        """``chw``: 3xHxW float32 RGB in 0..255 (a uint8 frame's values) on the device -> 3xhxw letterboxed in 0..1:
        Ultralytics' ``LetterBox`` with OpenCV's INTER_LINEAR arithmetic (``exact_resize``: the same bytes as the
        host path), then ``div(255)`` as its predictor does on the device."""
        import torch

        from enginekit import exact_resize

        if tuple(chw.shape[1:]) == tuple(hw):
            return chw.div(255)
        resized, padding = self.gpu_geometry(tuple(chw.shape[1:]), hw)
        boxed = exact_resize.letterbox(chw, resized, padding)
        return boxed.to(torch.float32).div_(255)

    def gpu_geometry(self, frame_hw: tuple[int, int], hw: tuple[int, int]):
        """``(resized h x w, (top, bottom, left, right))`` of a frame of ``frame_hw`` letterboxed to ``hw``: the full
        network size, or ``YOLO(pt).predict``'s rectangle where ``hw`` is one."""
        if tuple(frame_hw) == tuple(hw):
            return tuple(hw), (0, 0, 0, 0)
        rect = tuple(hw) != tuple(self.hw)
        (uh, uw), top, bottom, left, right = letterbox_geometry(tuple(frame_hw), self.hw if rect else tuple(hw),
                                                                auto=rect, stride=self.stride)
        if (uh + top + bottom, uw + left + right) != tuple(hw):
            raise ValueError(f"a {frame_hw[0]}x{frame_hw[1]} frame letterboxes to {uh + top + bottom}x"
                             f"{uw + left + right}, not {hw[0]}x{hw[1]}")
        return (uh, uw), (top, bottom, left, right)

    def preprocess_frames(self, frames: list, hw: tuple[int, int], rgb: bool):
        """HxWx3 uint8 frames (BGR unless ``rgb``) on one device -> the (N, 3, h, w) float32 batch ``preprocess_gpu``
        gives, from one kernel launch per frame that reads the frame's bytes where they are (``exact_resize.
        letterbox_into``: the letterbox, BGR to RGB and the division by 255 together, the same values); None where
        that kernel does not run (then the predictor runs ``preprocess_gpu``). Only this class's own letterbox
        (a subclass that prepares its input otherwise gets None)."""
        import torch

        from enginekit import exact_resize

        if type(self).preprocess_gpu is not YoloProcessor.preprocess_gpu or not frames:
            return None
        device = frames[0].device
        if any(f.dtype != torch.uint8 or f.dim() != 3 or f.shape[-1] != 3 or f.device != device for f in frames):
            return None
        if not exact_resize.kernel_usable(device):
            return None
        out = torch.empty((len(frames), 3, *hw), dtype=torch.float32, device=device)
        kept = []
        try:
            for i, frame in enumerate(frames):
                resized, padding = self.gpu_geometry(tuple(frame.shape[:2]), hw)
                kept.append(exact_resize.letterbox_into(frame, out[i], resized, padding, swap=not rgb))
        except ValueError:  # a frame that does not letterbox to hw: the caller's error, as on the host
            raise
        except Exception as exc:  # noqa: BLE001 - the kernel would not build or launch here: torch's operations
            exact_resize.kernel_failed(exc)
            return None
        # what the launches read, alive while a graph that captured them may replay (one entry per frame sizes)
        self._kernel_tables[(tuple(tuple(f.shape) for f in frames), tuple(hw), str(device))] = kept
        return out

    def nms(self, pred, *, nc: int = 0, rotated: bool = False) -> list:
        """The kept rows per image, as ``ultralytics.utils.nms.non_max_suppression`` keeps them for Ultralytics'
        predictors, with no time limit (its default, 2 s + 50 ms per image, stops early on a busy CPU and silently
        drops detections). Axis-aligned boxes go through ``kept_rows`` (the same arithmetic, fewer waits on the
        device); rotated boxes and end-to-end rows through Ultralytics' function itself."""
        if not rotated and not self.end2end:
            return kept_rows(pred, self.conf, self.iou, max_det=self.max_det, nc=nc)
        return ultralytics_nms()(pred, self.conf, self.iou, max_det=self.max_det, nc=nc, end2end=self.end2end,
                                 rotated=rotated, max_time_img=1e6)

    def queued_decode(self, outputs: dict, image_hws: list[tuple[int, int]], hw: tuple[int, int]):
        """The detection decode as device work with no wait (``queued_nms``) for these outputs (device tensors), or
        None (end-to-end rows, other tasks, host arrays). ``.run(outputs)``: the packed device tensors (fixed
        shapes: the predictor may capture it as a CUDA graph); ``.results(host_arrays, outputs)``: what
        ``postprocess`` returns, computed by ``postprocess`` itself where the packed flags say so."""
        if type(self) is not YoloProcessor or self.end2end:
            return None
        if any(isinstance(v, np.ndarray) or not hasattr(v, "device") for v in outputs.values()):
            return None
        return QueuedDecode(self, [tuple(s) for s in image_hws], tuple(hw))

    def _detections(self, det: np.ndarray, shape) -> Detections:
        ids = det[:, 5].astype(np.int64)
        return Detections(np.ascontiguousarray(det[:, :4], dtype=np.float32), det[:, 4].astype(np.float32), ids,
                          self.names_of(ids), tuple(shape))

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
                                      self.names_of(ids), tuple(shape)))
        return results


class QueuedDecode:
    """``YoloProcessor.queued_decode``'s answer for one batch's frame sizes and network size."""

    def __init__(self, processor: YoloProcessor, image_hws: list, hw: tuple):
        self.processor, self.image_hws, self.hw = processor, image_hws, hw
        p = processor
        self.key = ("detect", tuple(image_hws), hw, p.conf, p.iou, p.max_det)

    def run(self, outputs: dict) -> list:
        from enginekit.families.ultralytics.queued_nms import pack

        p = self.processor
        return pack(p.output(outputs, 0), self.image_hws, self.hw, p.conf, p.iou, max_det=p.max_det)

    def results(self, host: list, outputs: dict) -> list[Detections]:
        from enginekit.families.ultralytics.queued_nms import CAP, unpack

        p = self.processor
        anchors = outputs[p.info.output_names[0]].shape[-1]
        rows = [unpack(np.asarray(h), 6, p.max_det, min(CAP, anchors)) for h in host]  # x1 y1 x2 y2 score class
        if any(r is None for r in rows):
            return p.postprocess(outputs, self.image_hws, self.hw)
        return [p._detections(r, shape) for r, shape in zip(rows, self.image_hws)]


def _numpy(t, dtype=np.float32) -> np.ndarray:
    return t.cpu().numpy().astype(dtype, copy=False)


class _TaskProcessor(YoloProcessor):
    @property
    def nc(self) -> int:
        """The class count NMS needs to tell class scores from the task's channels after them."""
        if not self.names and not self.end2end:
            raise UsageError(f"the {self.adapter.family} graph does not name its classes (no 'names' metadata): "
                             "its class scores cannot be told from its other channels")
        return len(self.names)


class SegmentProcessor(_TaskProcessor):
    """Boxes + instance masks (N x H x W bool at the original resolution)."""

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


class ClassifyProcessor(TopClasses, ImageProcessor):
    """Top-k classes from the probabilities the exported ``Classify`` head computes (softmax)."""

    gpu_graphable = False  # torchvision's transforms on the GPU run as they are, not captured

    def __init__(self, adapter, metadata: dict, info, *, input_size=None, top_k: int = TopClasses.top_k, **_):
        super().__init__(adapter, metadata, info, input_size=input_size)
        self.top_k = top_k
        self._gpu_transforms = None

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


class HostStretch:
    """Mixed in before ``ImageProcessor``: frames stretched to the network's size with Ultralytics'
    ``LetterBox(scale_fill=True)`` (OpenCV on uint8) on the host, as its RT-DETR and depth predictors; on a GPU
    only the exact steps follow there. ``gpu_letterbox``: resized on the device instead (torch bilinear)."""

    def host_step(self, frame_hw: tuple[int, int], hw: tuple[int, int]) -> bool:
        return not getattr(self, "gpu_letterbox", False) and tuple(frame_hw) != tuple(hw)

    def preprocess_host(self, frame: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        return stretch(hw)(image=frame)

    def preprocess_cpu(self, rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        return to_input(self.preprocess_host(rgb, hw))

    def preprocess_gpu(self, chw, hw: tuple[int, int]):
        if tuple(chw.shape[1:]) == tuple(hw):  # stretched on the host: only divided, as Ultralytics' predictor
            return chw.div(255)
        return ImageProcessor.preprocess_gpu(self, chw, hw)


class RtdetrProcessor(HostStretch, YoloProcessor):
    """RT-DETR's kept rows (no NMS: the decoder's top-k), boxes in the original image's pixels; the image
    stretched to the network's size (Ultralytics' ``scale_fill``), no letterbox."""

    rect = False  # stretched to the network's size, as RTDETRPredictor (scale_fill): no rectangle
    channel_wise = False  # ImageProcessor's preprocess_gpu (it may normalise per channel)

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


class SemanticProcessor(YoloProcessor):
    """A class id per pixel at the original resolution, from the exported logits (B, nc, H, W)."""

    rect = False  # its graphs keep a fixed H x W: letterboxed to the full size

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


class YoloDepthProcessor(HostStretch, DepthMaps, ImageProcessor):
    """The depth map at the original resolution (the image stretched to the network's size, as Ultralytics)."""

    def __init__(self, adapter, metadata: dict, info, *, input_size=None, gpu_letterbox: bool = False, **_):
        super().__init__(adapter, metadata, info, input_size=input_size)
        self.gpu_letterbox = bool(gpu_letterbox)
