"""Ultralytics YOLO families: detect (yolov8*, yolo11*, yolo12*, yolo26*...) and every task of theirs.

A YOLO family serves ``<detector name><suffix>`` as Ultralytics spells them (``yolo12n``, ``yolo11n-seg``,
``yolo26s-pose``) and declares what its task makes differ: outputs by meaning, the head kept out of INT8,
preprocessing as Ultralytics' predictor does it, its decoding (instances) or task metrics, its processor.
Heads are switched to export mode as Ultralytics' exporter does (``export=True``, ``format``, ``dynamic``,
``max_det``), with one deliberate difference: the semantic head exports its upsampled logits (B, nc, H, W)
rather than a uint8 class map, so parity is measured on numbers and the class map is the argmax of them.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from enginekit.compare.instances import (
    IOU_NMS,
    MAX_DET,
    NO_TIME_LIMIT,
    Instances,
    keypoint_oks,
    mask_iou,
    oks_sigmas,
    paired_rows,
    rotated_iou,
)
from enginekit.compare.task_metrics import MIN_DEPTH_SPREAD
from enginekit.errors import UsageError
from enginekit.families.base import OutputPart
from enginekit.families.types import LoadedModel
from enginekit.families.evaluation import (
    ClassifyEvaluation,
    DepthEvaluation,
    InstanceEvaluation,
    SemanticEvaluation,
    instance_gates,
    label_gates,
)
from enginekit.families.registry import register
from enginekit.families.types import FamilyInfo
from enginekit.families.ultralytics.identity import head_end2end
from enginekit.families.ultralytics.base import (
    HUB_NOTE,
    TASK_SUFFIXES,
    StretchedInput,
    UltralyticsAdapter,
    class_count,
    coco_names,
    ultralytics_model_dir,
)
from enginekit.families.random_init import INFORMATIVE_TAG, make_informative
from enginekit.families.ultralytics.runtime import (
    ClassifyProcessor,
    ObbProcessor,
    PoseProcessor,
    SegmentProcessor,
    SemanticProcessor,
    YoloDepthProcessor,
    YoloProcessor,
)

from enginekit.families.graph_nms import torchvision_nms_as_greedy_graph
from enginekit.families.processing import parse_names
from enginekit.families.ultralytics.labels import read_split, truth_instances, val_image, val_letterbox, val_rectangles
from enginekit.families.ultralytics.runtime import letterbox, letterboxed_hw, to_input, ultralytics_nms

# "yolo12n", "yolov8s", "yolo11x": family token + scale letter; a task's name adds its suffix ("-seg").
NAME_RE = re.compile(r"^(yolov\d+|yolo\d+)([nsmlxtbce])$")
_SUFFIX_RE = re.compile(r"^(?P<base>.+?)(?P<suffix>-[a-z0-9]+)$")
#: ranked instances per image for a segmenter's mAP (a mask is decoded for each)
MAX_DET_MASKS = 100


# -- names ----------------------------------------------------------------------------------------------
def yolo_yaml(name: str, suffix: str = "") -> Path | None:
    """The YAML Ultralytics builds ``name`` from: ``yolo12.yaml`` serves every scale of yolo12
    (``yolo11-seg.yaml`` every yolo11 segmenter), while some (yolov9, yolov10) have one file per scale."""
    root = ultralytics_model_dir()
    if root is None or not name.endswith(suffix):
        return None
    match = NAME_RE.match(name[: len(name) - len(suffix)])
    if match is None:
        return None
    for stem in (f"{match.group(1)}{suffix}", name):
        for path in root.rglob(f"{stem}.yaml"):
            return path
    return None


def yolo_variants(suffix: str = "") -> list[str]:
    """Every ``<detector><suffix>`` Ultralytics has a YAML for (``yolo11{n,s,m,l,x}-seg`` for one file of all scales)."""
    root = ultralytics_model_dir()
    if root is None:
        return []
    names = set()
    for path in root.rglob(f"yolo*{suffix}.yaml"):
        if not path.stem.endswith(suffix):
            continue
        stem = path.stem[: len(path.stem) - len(suffix)]
        if NAME_RE.match(stem):  # one file per scale
            names.add(path.stem)
        elif NAME_RE.match(stem + "n"):  # one file for every scale
            names.add(f"{stem}{{n,s,m,l,x}}{suffix}")
    return sorted(names)


#: node names of an --nms graph: the model's under /nms/model/ (the prefix the exclusions below allow), the
#: suppression's own beside them. Both stay out of reduced precision: INT8 would quantize the scores that rank the
#: boxes (TopK) and the class offsets added to their corners, FP16 round the corners the IoUs come from.
IN_NMS = r"(?:/nms/model)?"
NMS_NODES = r"/nms/(?!model/)"


@lru_cache(maxsize=32)
def ends_in_own_nms(name: str, suffix: str = "") -> bool:
    """Whether Ultralytics' predictor runs the model ``name`` builds end to end (kept boxes, no NMS): the built module's
    head as its predictor reads it (``identity.head_end2end``). A YAML with ``end2end: True`` (yolo26) or a v10Detect
    gives the head a one-to-one branch beside the one-to-many one, which the predictor runs at its default."""
    path = yolo_yaml(name, suffix)
    if path is None:
        return False
    text = path.read_text()
    if re.search(r"^end2end:\s*True\b", text, re.M) is None and "v10Detect" not in text:
        return False  # no one-to-one branch to select
    from ultralytics import YOLO

    try:
        return head_end2end(YOLO(f"{name}.yaml").model)
    except Exception:  # noqa: BLE001 - a YAML this Ultralytics cannot build: loading it says so
        return False


class YoloFamily(UltralyticsAdapter):
    """A YOLO family: ``<detector name><suffix>`` (suffix "" for detectors)."""

    suffix = ""
    # An --nms graph's suppression stays FP32: box corners up to 640 px are 0.25-0.5 px apart in FP16, enough to
    # move an IoU across the threshold and keep another box (a graph without NMS has no such node)
    fp16_keep_fp32 = (NMS_NODES,)

    @classmethod
    def matches(cls, name: str) -> bool:
        return yolo_yaml(name, cls.suffix) is not None

    @classmethod
    def near_miss(cls, name: str) -> str | None:
        match = _SUFFIX_RE.match(name)
        if not cls.suffix or match is None or yolo_yaml(match.group("base")) is None:
            return None
        base = match.group("base")
        tasks = [s for s in TASK_SUFFIXES.values() if s and yolo_yaml(base + s, s) is not None]
        return (f"{base} has no task {match.group('suffix')!r}; Ultralytics builds {base} with "
                + ", ".join(f"{base}{s}" for s in tasks))

    @classmethod
    def variants(cls) -> list[str]:
        return yolo_variants(cls.suffix)

    def ends_in_own_head(self) -> bool:
        """Whether the model ends in a one-to-one head (its outputs are kept boxes): what its module or metadata
        says (``facts``), else the YAML its name builds."""
        return self.facts.end2end if self.facts is not None else ends_in_own_nms(self.variant, self.suffix)

    def nms_refusal(self) -> str | None:
        return (f"{self.variant} is a {self.task} model: it has no boxes to suppress (--nms applies to detectors, "
                "segment, pose and obb models)")

    # -- labels (verify --data): an Ultralytics dataset, read by Ultralytics (families.ultralytics.labels) ------
    def read_labels(self, dataset, split: str, metadata: dict[str, str], *, limit: int | None = None,
                    imgsz: int = 640):
        """The labelled images of ``split`` (a ``labels.LabelledSplit``); one line where this task takes none."""
        import ast

        if not hasattr(self, "label_scores"):
            raise UsageError(f"{self.variant} is a {self.task} model: verify --data scores detect, segment, pose, obb "
                             "and classify models against labels")
        kpt = metadata.get("kpt_shape")
        return read_split(dataset, split, self.task, parse_names(metadata.get("names")) or self.default_class_names(),
                          limit=limit, kpt_shape=ast.literal_eval(kpt) if isinstance(kpt, str) else kpt, imgsz=imgsz)



# -- instances: detect, segment, pose, obb --------------------------------------------------------------
_END2END_REFUSAL = ("{} ends in a one-to-one head whose outputs are the kept boxes already (no NMS to add): "
                    "export it without --nms")


def _zero_padded(nms_model):
    """Ultralytics' NMSModel with the rows past the kept boxes zeroed: its fixed-size candidate
    path also returns, after them, the candidates it scored 0 (under conf or suppressed), with
    their boxes. Its greedy NMS (``torchvision.ops.nms``, ONNX NonMaxSuppression, which
    TensorRT-RTX cannot build) runs as ``graph_nms.greedy_nms``: the same kept boxes in ordinary
    operators. (Rotated boxes use Ultralytics' own Fast-NMS, already in ordinary operators.)"""
    import torch

    class ZeroPadded(torch.nn.Module):
        def __init__(self, nms):
            super().__init__()
            self.nms = nms

        def forward(self, x):
            with torchvision_nms_as_greedy_graph():
                out = self.nms(x)
            if isinstance(out, tuple):  # a segmenter's (kept instances, mask prototypes)
                return (out[0] * (out[0][..., 4:5] > 0), *out[1:])
            return out * (out[..., 4:5] > 0)

    return ZeroPadded(nms_model).eval()


def nms_rows(output: np.ndarray, conf: float, *, nc: int = 0, end2end: bool = False, rotated: bool = False,
             max_det: int = MAX_DET, multi_label: bool = False) -> list[np.ndarray]:
    """Kept rows per image by Ultralytics' NMS (or its end-to-end filter), with no time limit:
    [x1, y1, x2, y2 (xywh for rotated), score, class, task channels (angle last for obb)]. ``multi_label``:
    a box kept once per class scoring above ``conf``, as Ultralytics' validators decode."""
    import torch

    preds = ultralytics_nms()(torch.from_numpy(np.ascontiguousarray(output, dtype=np.float32)), conf_thres=conf,
                                iou_thres=IOU_NMS, max_det=max_det, nc=0 if end2end else nc, rotated=rotated,
                                end2end=end2end, max_time_img=NO_TIME_LIMIT, multi_label=multi_label)
    return [p.numpy() for p in preds]


class _YoloInstances(InstanceEvaluation, YoloFamily):
    """YOLO tasks whose output0 is ranked instances: boxes, class scores, then the task's channels
    (none for detect); or, end to end (one-to-one heads, ``--nms``), kept rows of box, score, class, channels."""

    extra_part = ""  # name of the task channels after the class scores
    extra_kind = "values"
    #: what its graph's outputs are, by rank: instances (B, channels, anchors) or kept rows (B, max_det, channels)
    output_ranks = {"output0": 3}
    #: rotated boxes (obb): decoded with probiou NMS, drawn as centre, size and angle
    rotated = False
    # Graphs take any H x W (Ultralytics' dynamic=True export): the runtime then letterboxes each frame to the
    # smallest stride-aligned rectangle, as YOLO(pt).predict does (LetterBox(auto=True): 640x480 for a 4:3
    # frame), and gives its boxes on any aspect ratio. Exported at the first profile's size, the graph records
    # it (export_shape) as the size frames are letterboxed to. Engines take what their profiles cover.
    export_at_profile_size = True

    @property
    def rect_stride(self) -> int:
        """The stride the rectangle is aligned to: the model's largest (32 for Ultralytics' P5 YAMLs, 64 for P6)."""
        return self.stride

    def rect_hw(self, image_hw, hw):
        return letterboxed_hw(tuple(image_hw), tuple(hw), auto=True, stride=self.rect_stride)

    def preprocess_rect(self, image_rgb, hw):
        """Ultralytics' ``LetterBox(auto=True)`` at network size ``hw``, as its ``.pt`` predictor."""
        return to_input(letterbox(hw, auto=True, stride=self.rect_stride)(image=image_rgb))[None]

    def label_truth(self, split, sample, image_bgr, letterbox):
        return truth_instances(split, sample, image_bgr, letterbox)

    # ``yolo val``'s input: labels are scored as Ultralytics' validator scores them, so the FP32 figure is the one
    # users have (``YOLO(pt).val()``): its rectangle per image for a model that takes any H x W, else the full size
    def label_rectangles(self, split, hw: tuple[int, int]) -> list[tuple[int, int] | None]:
        """Per sample, the validator's rectangle (``rect=True``, batch 1) at network size ``hw``."""
        shapes = [s.label.get("shape") if s.label is not None else None for s in split.samples]
        if any(s is None for s in shapes):
            return [None] * len(shapes)
        return val_rectangles([tuple(s) for s in shapes], max(hw), getattr(self, "rect_stride", 32))

    def label_input(self, sample, hw: tuple[int, int]):
        """(the image as loaded, the network input, the letterbox that made it) of ``sample`` at input ``hw`` (its
        validator rectangle, or the network's size), as Ultralytics' validator makes them."""
        bgr = val_image(sample)
        letterbox = val_letterbox(hw)
        return bgr, to_input(letterbox(image=np.ascontiguousarray(bgr[..., ::-1])))[None], letterbox

    @property
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        kept = self.nms is not None or self.ends_in_own_head()  # (B, max_det, 6+): rows, not anchors
        axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch"} if kept else
                {0: "batch", 2: "anchors"}}
        if "output1" in self.output_names:  # mask prototypes at 1/4 of the input
            axes["output1"] = {0: "batch", 2: "mask_height", 3: "mask_width"}
        return axes
    # the head's branches that INT8 leaves alone: box/DFL and class branches (as for detectors), and
    # each task's own branch (mask coefficients, keypoints, angle: cv4) and the mask prototypes
    int8_exclude = (
        IN_NMS + r"/model\.\d+/(one2one_)?cv[234]\.\d+/.*",
        IN_NMS + r"/model\.\d+/(one2one_)?cv4_(kpts|sigma)\.\d+/.*",
        IN_NMS + r"/model\.\d+/(one2one_)?dfl/.*",
        IN_NMS + r"/model\.\d+/proto/.*",
        NMS_NODES,
    )

    @classmethod
    def describe(cls) -> FamilyInfo:
        import dataclasses

        return dataclasses.replace(super().describe(), nms=True)

    def box_kind(self, end2end: bool) -> str:
        return "boxes_xyxy" if end2end and not self.rotated else "boxes_xywh"

    def output_parts(self, metadata=None):
        meta = metadata or {}
        if meta.get("end2end") == "True":  # (B, max_det, 6 + extra): box, score, class, task channels
            parts = (OutputPart("boxes", "output0", -1, 0, 4, self.box_kind(True)),
                     OutputPart("scores", "output0", -1, 4, 5, "probabilities"),
                     OutputPart("classes", "output0", -1, 5, 6, "classes"))
            return (*parts, OutputPart(self.extra_part, "output0", -1, 6, None, self.extra_kind)) if self.extra_part \
                else parts
        nc = class_count(meta)
        if not self.extra_part or nc is None:  # (B, 4 + nc, anchors); names unknown: scores and channels as one
            return (OutputPart("boxes", "output0", 1, 0, 4, self.box_kind(False)),
                    OutputPart("scores", "output0", 1, 4, None, "probabilities"))
        return (OutputPart("boxes", "output0", 1, 0, 4, self.box_kind(False)),
                OutputPart("scores", "output0", 1, 4, 4 + nc, "probabilities"),
                OutputPart(self.extra_part, "output0", 1, 4 + nc, None, self.extra_kind))

    def known_parts(self):
        return ("boxes", "scores", "classes", *((self.extra_part,) if self.extra_part else ()))

    def parity_outputs(self, reference, candidate, metadata):
        if metadata.get("nms") != "True" and metadata.get("end2end") != "True":
            return reference, candidate
        # kept-box rows (an --nms graph, a one-to-one head: yolo26, yolov10): compare the ones both kept, as one box
        # (tied scores order rows as each runtime's top-k breaks ties)
        ref, cand = paired_rows(reference["output0"], candidate["output0"], xywh=self.box_kind(True) == "boxes_xywh")
        return {**reference, "output0": ref}, {**candidate, "output0": cand}

    # -- decoding: outputs -> instances in the input's pixels ------------------------------------------
    def _rows(self, outputs, metadata, conf, max_det, validator=False) -> list[np.ndarray]:
        nc = 0 if not self.extra_part else class_count(metadata) or 80
        return nms_rows(outputs["output0"], conf, nc=nc, end2end=metadata.get("end2end") == "True",
                        rotated=self.rotated, max_det=max_det, multi_label=validator)

    def decode(self, outputs, metadata, conf, *, hw=None, max_det=MAX_DET, validator=False):
        """``validator``: as Ultralytics' validators decode for mAP against labels (multi-label NMS)."""
        return [Instances.from_rows(r) for r in self._rows(outputs, metadata, conf, max_det, validator)]

    # -- --nms ---------------------------------------------------------------------------------------
    def nms_refusal(self) -> str | None:
        # Ultralytics' nms=True wrapper keeps each instance's task channels (mask coefficients, keypoints,
        # angle) beside its box, score and class: the same rows as a one-to-one head's
        if self.ends_in_own_head():
            return _END2END_REFUSAL.format(self.variant)
        return None

    def export_module(self, loaded: LoadedModel, batch: int):
        """With ``--nms``: Ultralytics' NMS wrapper, unrolled over ``batch`` images (its trace
        serves batches up to that one; smaller batches are padded, as Ultralytics' export does)."""
        if self.nms is not None:
            loaded.module.nms.args.batch = batch
        return loaded.module

    def _finish(self, prepared, metadata):
        if self.nms is None:
            return prepared, metadata
        return self._wrap_nms(prepared), {**metadata, "end2end": "True"}

    def _wrap_nms(self, model):
        """The prepared model inside Ultralytics' ``nms=True`` wrapper (``exporter.NMSModel``):
        one graph from image to kept boxes, (B, max_det, 6) x1 y1 x2 y2 score class, zero-padded."""
        from types import SimpleNamespace

        import torchvision.ops  # noqa: F401 - NMSModel imports it in forward; its import calls an op a trace refuses
        from ultralytics.engine.exporter import NMSModel

        head = model.model[-1]
        if getattr(model, "end2end", False) or getattr(head, "end2end", False):
            raise UsageError(f"--nms: {_END2END_REFUSAL.format(self.variant)}")
        head.xyxy = True  # NMSModel takes corner boxes, as Ultralytics' exporter sets for nms=True
        s = self.nms
        args = SimpleNamespace(format="onnx", dynamic=True, batch=2, conf=s.conf, iou=s.iou, max_det=s.max_det,
                               agnostic_nms=s.agnostic, opset=None)
        wrapper = NMSModel(model, args).eval()
        # Ultralytics' fixed-size candidate path (its TensorFlow one): scores under conf zeroed and
        # the top max_det*5 kept, rather than a boolean mask (NonZero: TensorRT-RTX has no such layer)
        wrapper.is_tf = True
        return _zero_padded(wrapper)


@register
class YoloAdapter(_YoloInstances):
    family = "yolo"
    task = "detect"
    example = "yolo12n"
    processor = YoloProcessor
    records_head = False
    # The Detect head's last convolutions (each box/DFL and class branch's final Conv2d, cv2.i.2 / cv3.i.2,
    # which write the box distributions and class logits) and the DFL stay out of INT8, as NVIDIA's YOLO PTQ
    # guides keep them: quantizing them collapses confidence scores. Detect's branches are ModuleLists
    # (cv2.0, cv3.1, ...), which tells them from the cv1/cv2 convolutions of C2f blocks. Measured 2026-11-27
    # (benchmarks/int8_detectors.md): keeping the branches' earlier convolutions out too (the whole head)
    # keeps 19 of 88 / 25 of 123 quantizable nodes of a trained yolov8s / yolo11s in high precision (22% /
    # 20%) for the same detections (recall 0.992 / 0.986, precision 1 / 1 on 123 / 143 FP32 detections);
    # the last convolutions alone keep 7 of 88 / 7 of 123 (8% / 6%).
    int8_exclude = (IN_NMS + r"/model\.\d+/(one2one_)?cv[23]\.\d+/(one2one_)?cv[23]\.\d+\.2/.*",
                    IN_NMS + r"/model\.\d+/(one2one_)?dfl/.*", NMS_NODES)
    # Against the FP32 detections at the operating point (conf 0.25): a graph fails when it loses
    # more than 5% of them (recall), adds more than 5% (precision), or ranks them below mAP50 0.9
    # (measured in families/ultralytics/base.py: fp16 1 / 1 / 0.995, int8 1 / 0.98 / 0.994 on the trained
    # detector). FP32 graphs differ from PyTorch by ~1e-6 in score: one flip in 100 detections is already a fault.
    task_gates = instance_gates("map50")
    # the operating point: Ultralytics predict's default confidence; conf_margin as every instance task
    # (a detection whose score crosses conf by less is a threshold flip, not lost or extra; 0: the plain rule)
    task_options = {"conf": 0.25, "conf_margin": None}  # None: the band measured (compare.instances)
    #: detectors only: seeded weights whose outputs depend on the image (``random_init.make_informative``). The
    #: other YOLO tasks keep Ultralytics' own random init: on it a classifier's FP32 graph differed from
    #: PyTorch by rel L2 5.9e-4 and a segmenter's FP32 masks flipped (mask mAP50 0.95), so their FP32 gates
    #: would fail on the init, not on the graph
    random_init_tag = INFORMATIVE_TAG

    def _random_init(self, model, seed: int):
        return make_informative(model, seed, self.preprocess, tuple(self.default_input[2:]))

    @classmethod
    def describe(cls) -> FamilyInfo:
        return FamilyInfo(cls.family, cls.task, cls.variants(), "1x3x640x640 (dynamic batch)", HUB_NOTE,
                          "any detector Ultralytics builds by name, run as YOLO(pt).predict runs it (a yolo26 or "
                          "yolov10 head: its one-to-many branch, NMS after the network); --nms puts Ultralytics' "
                          "NMS in the graph", nms=True)

    def default_class_names(self) -> dict[int, str]:
        return coco_names()  # Ultralytics' detectors are COCO's unless their checkpoint says otherwise


# INT8 of segment, pose and obb heads, measured 2026-11-26 (benchmarks/int8_tasks.py; ONNX Runtime CPU against
# PyTorch FP32, 2-core CPU):
# the suite's trained yolo11n-seg/-pose/-obb (tests/trained_tasks.py: generated shapes, 160 px), 8 held-out
# images at conf 0.1 (25 / 11 / 18 FP32 instances), heads excluded (_HEAD_EXCLUDE), YOLO's max calibration.
#   calibrated on 8 images of the models' own kind (generated shapes, another seed):
#     seg  scores rel L2 0.064, recall 1, precision 1, mask mAP50 0.995
#     pose scores rel L2 0.047, keypoints rel L2 0.006, recall 1, precision 1, pose mAP50 0.995
#     obb  boxes rel L2 0.0088, angle max abs 0.032 rad, recall 1, precision 1, mAP50 0.995
#   calibrated on the 8 embedded photographs (the default), every model fails:
#     seg  scores rel L2 0.29 (limit 0.25), recall 0.92, precision 0.92
#     pose scores rel L2 0.54, recall 0.727, pose mAP50 0.877
#     obb  boxes rel L2 0.057 (limit 0.05), max abs 44 px; at conf 0.25 recall 0.889, mAP50 0.829. A real loss,
#          not a tolerance wrong for obb: the angle moves by at most 0.18 rad (no wrap) and the same boxes
#          limit holds about 6x over with calibration on shapes.
#   The photographs' activation ranges are not these models': per tensor, photographs/shapes amax spans
#   0.27-1.3 (seg) and 0.2-49 (pose, obb; widest in the neck): they differ throughout the network, not in a
#   few nodes an exclusion could keep out of INT8. Entropy keeps as many (seg, obb) or fewer (pose: recall 0.909) instances than max,
#   percentile 99.99 (ONNX Runtime's, through the same calibrator hook) fewer (seg 0.92, pose 0.909).
#   Calibrated on noise: seg recall 0.28, pose and obb 0 (every task gate fails).
#   yolo11n-cls (96 px, 8 held-out shapes): top-1 agreement 1 with either calibration set, and on noise too
#   (probabilities rel L2 0.20): its top-1 leads by 0.93 on average.
# INT8 wants calibration images of what the model sees (--calib-data DIR); verify says so when a graph
# calibrated on the embedded photographs fails.


class _YoloTaskInstances(_YoloInstances):
    # the operating point: Ultralytics predict's default confidence. conf_margin: scores that cross it by less
    # count as threshold flips, not as lost or extra instances (compare.instances.instance_metrics); 0 keeps
    # the plain rule. Lightly trained models score many instances near any threshold (the suite's segmenter:
    # 4 of its 7 instances at 0.25 on 8 held-out images lie within 0.005 of it): --tol conf_margin=0.02 there.
    task_options = {"conf": 0.25, "conf_margin": None}  # None: the band measured (compare.instances)
    photographs_of = "what the model sees"

    @property
    def instances_name(self) -> str:
        return f"{self.task} predictions"


@register
class YoloSegmentAdapter(_YoloTaskInstances):
    family = "yolo-seg"
    task = "segment"
    suffix = "-seg"
    processor = SegmentProcessor
    example = "yolo11n-seg"
    summary = "instance masks: output0 boxes + class scores + 32 mask coefficients, output1 prototypes"
    output_names = ("output0", "output1")
    output_ranks = {"output0": 3, "output1": 4}  # prototypes (B, 32, H/4, W/4)
    extra_part = "mask_coefficients"
    task_gates = instance_gates("mask_map50")
    label_gates = label_gates("mask_map50_95")
    metric_prefix = "mask_"
    box_map50 = True
    ranked_max_det = MAX_DET_MASKS

    def output_parts(self, metadata=None):
        return (*super().output_parts(metadata), OutputPart("prototypes", "output1", kind="values"))

    def known_parts(self):
        return (*super().known_parts(), "prototypes")

    def decode(self, outputs, metadata, conf, *, hw=None, max_det=MAX_DET, validator=False):
        """Instances with binary masks at the prototypes' resolution (1/4 of the input, as the validator's
        ``mask_ratio`` 4), by Ultralytics' ``process_mask``. An instance whose mask is empty (no pixel inside
        its box) has nothing to compare by mask IoU: it is left out (``Instances.left_out``), unless
        ``validator`` (decoded as Ultralytics' validator does, for mAP against labels: multi-label, all kept)."""
        import torch
        from ultralytics.utils.ops import process_mask

        protos = outputs["output1"]
        result = []
        for rows, proto in zip(self._rows(outputs, metadata, conf, max_det, validator), protos):
            mh, mw = proto.shape[1:]  # the prototypes upsample stride-8 features twice
            if len(rows):
                masks = process_mask(torch.from_numpy(proto),
                                     torch.from_numpy(np.ascontiguousarray(rows[:, 6:6 + proto.shape[0]])),
                                     torch.from_numpy(np.ascontiguousarray(rows[:, :4])), (mh * 4, mw * 4)).numpy()
            else:
                masks = np.zeros((0, mh, mw), dtype=np.float32)
            keep = masks.reshape(len(rows), -1).any(1) if len(rows) else np.zeros(0, dtype=bool)
            if validator:
                keep[:] = True
            instances = Instances.from_rows(rows[keep], masks=masks[keep])
            instances.left_out = int((~keep).sum())
            result.append(instances)
        return result

    def similarity(self, metadata):
        return mask_iou

    def decoding_notes(self, refs, cands):
        return {"empty_masks_reference": float(sum(r.left_out for r in refs)),
                "empty_masks_candidate": float(sum(c.left_out for c in cands))}


@register
class YoloPoseAdapter(_YoloTaskInstances):
    family = "yolo-pose"
    task = "pose"
    suffix = "-pose"
    processor = PoseProcessor
    example = "yolo11n-pose"
    summary = "keypoints: output0 boxes + class scores + keypoints (x, y, visibility) per anchor"
    extra_part = "keypoints"
    task_gates = instance_gates("pose_map50")
    label_gates = label_gates("pose_map50_95")
    metric_prefix = "pose_"
    box_map50 = True

    def _metadata(self, model):
        meta = super()._metadata(model)
        meta["kpt_shape"] = str(list(model.model[-1].kpt_shape))
        return meta

    @staticmethod
    def _kpt_shape(metadata) -> tuple[int, int]:
        import ast

        return tuple(ast.literal_eval(metadata.get("kpt_shape", "[17, 3]")))

    def _rows(self, outputs, metadata, conf, max_det, validator=False):
        nc = class_count(metadata) or 1
        return nms_rows(outputs["output0"], conf, nc=nc, end2end=metadata.get("end2end") == "True", max_det=max_det,
                        multi_label=validator)

    def decode(self, outputs, metadata, conf, *, hw=None, max_det=MAX_DET, validator=False):
        """Instances with keypoints (N, K, 3): x, y in the input's pixels, visibility (1 where the head has none)."""
        nk, dims = self._kpt_shape(metadata)
        result = []
        for rows in self._rows(outputs, metadata, conf, max_det, validator):
            k = np.ascontiguousarray(rows[:, 6:6 + nk * dims]).reshape(len(rows), nk, dims)
            if dims == 2:
                k = np.concatenate([k, np.ones_like(k[..., :1])], -1)
            result.append(Instances.from_rows(rows, keypoints=k))
        return result

    def similarity(self, metadata):
        return keypoint_oks(oks_sigmas(self._kpt_shape(metadata)[0]))


@register
class YoloObbAdapter(_YoloTaskInstances):
    family = "yolo-obb"
    task = "obb"
    suffix = "-obb"
    processor = ObbProcessor
    example = "yolo11n-obb"
    summary = "rotated boxes: output0 xywh + class scores + angle (radians), compared by probiou"
    extra_part = "angle"
    task_gates = instance_gates("map50")
    # Ultralytics' NMS for rotated boxes is its fast NMS over a probiou matrix, in ordinary operators
    # (TorchNMS.fast_nms, the export path that zeroes suppressed scores), as its predict does
    nms_form = "fast"
    rotated = True  # rotated boxes stay centre + size, the angle beside them
    label_conf = 0.01  # Ultralytics' validator's default for obb (``BaseValidator``: "reduce OBB val memory usage")

    def decode(self, outputs, metadata, conf, *, hw=None, max_det=MAX_DET, validator=False):
        """Instances with rotated boxes (N, 5): centre x, centre y, width, height, angle (radians)."""
        result = []
        for rows in self._rows(outputs, metadata, conf, max_det, validator):
            instances = Instances.from_rows(rows)
            instances.boxes = np.ascontiguousarray(np.concatenate([rows[:, :4], rows[:, -1:]], axis=1),
                                                   dtype=np.float32)
            result.append(instances)
        return result

    def similarity(self, metadata):
        return rotated_iou


# -- classify, semantic, depth --------------------------------------------------------------------------
@register
class YoloClassifyAdapter(ClassifyEvaluation, YoloFamily):
    family = "yolo-cls"
    task = "classify"
    suffix = "-cls"
    processor = ClassifyProcessor
    example = "yolo11n-cls"
    summary = "class probabilities (softmax); input resized and centre-cropped as Ultralytics classifies"
    default_input = (1, 3, 224, 224)
    output_ranks = {"output0": 2}  # class probabilities (B, nc)
    input_description = "NCHW RGB float32 in [0,1], shorter side resized then centre-cropped (Ultralytics classify)"
    int8_exclude = (r"/model\.\d+/linear/.*",)

    def _metadata(self, model):
        meta = super()._metadata(model)
        meta["end2end"] = "False"
        return meta

    def _prepare(self, model):
        model = super()._prepare(model)
        from ultralytics.nn.modules.head import Classify

        for m in model.modules():
            if isinstance(m, Classify):
                m.export = True  # softmax probabilities alone
        return model

    def preprocess(self, image_rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        from PIL import Image
        from ultralytics.data.augment import classify_transforms

        size = hw if hw[0] != hw[1] else hw[0]
        return classify_transforms(size)(Image.fromarray(image_rgb)).numpy()[None]


class _DenseTask(YoloFamily):
    """Per-pixel outputs at the input's size; H/W stay fixed as for every YOLO graph."""

    def _metadata(self, model):
        meta = super()._metadata(model)
        meta["end2end"] = "False"
        return meta


@register
class YoloSemanticAdapter(SemanticEvaluation, _DenseTask):
    family = "yolo-sem"
    task = "semantic"
    suffix = "-sem"
    processor = SemanticProcessor
    example = "yolo26n-sem"
    summary = "semantic segmentation: per-pixel class logits (B, nc, H, W); the class map is their argmax"
    int8_exclude = (r"/model\.\d+/classifier/.*",)

    def _prepare(self, model):
        model = super()._prepare(model)
        from ultralytics.nn.modules.head import SemanticSegment

        for m in model.modules():
            if isinstance(m, SemanticSegment):
                m.export, m.format, m.bake_argmax = True, "engine", False  # logits, not a uint8 class map
        return model


@register
class YoloDepthAdapter(DepthEvaluation, StretchedInput, _DenseTask):
    family = "yolo-depth"
    task = "depth"
    suffix = "-depth"
    processor = YoloDepthProcessor
    example = "yolo26n-depth"
    summary = "monocular depth (B, 1, H, W), positive; input stretched to size as Ultralytics' depth predictor"
    input_description = "NCHW RGB float32 in [0,1], resized to H x W without letterbox (Ultralytics depth)"
    # random weights: one depth (about 1.2 m, relative spread 3e-4) whatever the image
    min_relative_spread = MIN_DEPTH_SPREAD
    # The Depth module stays out of INT8, all of it: projections, refinement blocks, the top-down fusion (its
    # upsampling and additions) and the output head before the exp. Measured 2026-11-26 (benchmarks/int8_tasks.py
    # and verify; ONNX Runtime CPU against PyTorch FP32, 2-core CPU): the suite's trained yolo26n-depth
    # (tests/trained_tasks.py: generated shapes on a ground plane, 128 px), 8 held-out images (relative spread of
    # the reference 0.18), YOLO's max calibration; AbsRel / delta1 calibrated on shapes, photographs, noise:
    #   output head excluded                 0.071 / 0.990   0.082 / 0.979   0.066 / 0.945
    #   + projections and refinement blocks  0.053 / 0.993   0.091 / 0.959   0.067 / 0.945
    #   the whole module (this)              0.049 / 0.995   0.066 / 0.989   0.067 / 0.945
    # AbsRel after the scale-and-shift fit hardly tells calibrations apart (the backbone's INT8 error spreads
    # evenly); delta1 does: the INT8 gate keeps both real calibration sets and fails noise on delta1. (The
    # earlier limits, AbsRel 0.15 and delta1 0.8, passed every cell.) FP16: AbsRel 1e-4, delta1 1.
    @property
    def int8_exclude(self) -> tuple[str, ...]:
        return (rf"/model\.{self._depth_layer()}/.*",)

    def _depth_layer(self) -> int:
        """The Depth module's index: the last layer of the YAML Ultralytics builds the model from (23 in
        yolo26-depth.yaml, every scale)."""
        import yaml

        if self.facts is not None and self.facts.last_layer is not None:
            return self.facts.last_layer
        path = yolo_yaml(self.variant, self.suffix)
        if path is None:
            return 23
        spec = yaml.safe_load(path.read_text())
        return len(spec["backbone"]) + len(spec["head"]) - 1

    _metric_gates = {"abs_rel": ("<=", 0.05), "delta1": (">=", 0.95)}
    _int8_gates = {"abs_rel": ("<=", 0.1), "delta1": (">=", 0.97)}
    task_gates = {"fp32": {"abs_rel": ("<=", 1e-3), "delta1": (">=", 0.999)},
                  "fp16": dict(_metric_gates), "int8": dict(_int8_gates), "fp8": dict(_int8_gates)}


    def _prepare(self, model):
        model = super()._prepare(model)
        from ultralytics.nn.modules.head import Depth

        for m in model.modules():
            if isinstance(m, Depth):
                m.export, m.format = True, "onnx"  # depth upsampled 4x to the input size
        return model
