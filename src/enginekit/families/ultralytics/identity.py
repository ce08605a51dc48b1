"""What an Ultralytics model is, read from what it is made of: a checkpoint's module, or the metadata of a file
Ultralytics (or enginekit) wrote. Never from a name.

A checkpoint holds its ``nn.Module``: the module's class gives the task (``DetectionModel``, ``SegmentationModel``,
``RTDETRDetectionModel``...), its head the classes and whether it ends in its own one-to-one branch, the
checkpoint the class names. The YAML it records (``model.yaml``) varies with how it was made: ``yaml_file`` is
absent after fine-tuning from a ``best.pt`` and in older releases, which also write ``depth_multiple`` /
``width_multiple`` instead of ``scales`` + ``scale``, and teams copy and rename YAMLs; so it is read for display
only (``ModelFacts.architecture``). What a run calls the model is the file's stem (``people.pt`` -> ``people``).

A model name given with a checkpoint (``export yolov8s -w best.pt``) is checked by structure: the checkpoint's
layer names and weight shapes against the named architecture's built with the checkpoint's classes, so any
spelling of the same YAML matches and another architecture is refused, naming what the checkpoint is.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from enginekit.errors import EnginekitError, UsageError
from enginekit.families.base import describe_load_error
from enginekit.families.checkpoints import load_ultralytics_model

#: the family enginekit serves each Ultralytics task with (RT-DETR's module: ``rtdetr``)
TASK_FAMILIES = {"detect": "yolo", "segment": "yolo-seg", "pose": "yolo-pose", "obb": "yolo-obb",
                 "classify": "yolo-cls", "semantic": "yolo-sem", "depth": "yolo-depth"}
#: Ultralytics' tasks its exports record
_TASKS = tuple(TASK_FAMILIES)
#: what Ultralytics' model names add for each task (``yolo11n`` -> ``yolo11n-seg``)
TASK_SUFFIXES = {"detect": "", "segment": "-seg", "pose": "-pose", "obb": "-obb", "classify": "-cls",
                 "semantic": "-sem", "depth": "-depth"}


@dataclass(frozen=True)
class ModelFacts:
    """What an Ultralytics model is, whatever it is called: enough to export, judge and run it.

    ``name``: what output calls it (a checkpoint's file stem; an export's recorded model);
    ``architecture``: the YAML name it records, for display (None where it records none); ``source``: the
    checkpoint file (None: read from a graph's metadata); ``structure``: a digest of its layers' names and
    weight shapes (a checkpoint's; "" from metadata)."""

    name: str
    family: str
    task: str
    architecture: str | None = None
    end2end: bool = False
    last_layer: int | None = None
    stride: int = 32
    classes: int = 0
    source: str | None = None
    structure: str = ""
    #: a checkpoint's layers (``structure``), its keypoint layout and input channels: what a name given with it is
    #: checked against (``check_architecture``)
    layers: tuple = ()
    kpt_shape: tuple | None = None
    channels: int = 3
    #: the size it was trained at (``train_args.imgsz``), which ``YOLO(file)`` predicts, exports and validates at
    imgsz: tuple[int, int] | None = None

    def describe(self) -> str:
        """One phrase: "a detect model, 2 classes (yolov8s, as its YAML records)"."""
        article = "an" if self.task[:1] in "aeiou" else "a"
        kind = "an RT-DETR detect model" if self.family == "rtdetr" else f"{article} {self.task} model"
        classes = f", {self.classes} class{'es' if self.classes != 1 else ''}" if self.classes else ""
        built = f" (built from {self.architecture}.yaml)" if self.architecture else " (its YAML records no file)"
        return f"{kind}{classes}{built}"


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is an Ultralytics checkpoint: a torch.save zip whose pickle names Ultralytics' model classes
    (their module's name is in its bytes), read without unpickling it. A TorchScript program (its code/) is not."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
            if not pickles or any("/code/" in n for n in names):
                return False
            with z.open(pickles[0]) as f:
                return b"ultralytics.nn." in f.read(64 * 2**20)
    except (OSError, zipfile.BadZipFile, RuntimeError):
        return False


def architecture_name(spec: dict) -> str | None:
    """The YAML name a model YAML dict records (``yolov8n``, ``yolo11s-seg``, ``ppe-detector-v3``): its file's name
    with its scale, as Ultralytics names its models; None where it records no file. For display only."""
    stem = Path(str(spec.get("yaml_file") or "")).stem
    if not stem:
        return None
    scale = spec.get("scale")
    if scale and not re.search(rf"\d{re.escape(str(scale))}(?:-|$)", stem):
        stem = re.sub(r"^(yolo(?:v)?\d+)", rf"\g<1>{scale}", stem, count=1)  # yolov8-seg + s -> yolov8s-seg
    return stem


def structure(model) -> list[tuple[str, tuple[int, ...]]]:
    """The layers' weights by name and shape (every parameter of two or more dimensions: convolutions, linear
    layers): the same for any YAML spelling of one architecture, fused or not (BatchNorm folds into the conv's
    weight, whose name and shape stay)."""
    return [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.dim() >= 2]


def _digest(layers) -> str:
    return hashlib.sha256(repr(layers).encode()).hexdigest()


def _head(model):
    seq = getattr(model, "model", None)
    try:
        return seq[-1]
    except (TypeError, IndexError, KeyError):
        return None


def head_end2end(model) -> bool:
    """Whether Ultralytics' predictor runs the model's head end to end (its one-to-one branch: kept boxes, no NMS), read
    where it reads it: ``YOLO(pt).predict`` selects the head's branch by its ``nms`` argument (``AutoBackend(...,
    end2end=args.nms is False)``), so at its default (``nms=None``: NMS after the network) a head holding both branches
    (YOLO26, YOLOv10) runs one-to-many with NMS, whatever its YAML's ``end2end`` or the head's own switch say. Only a
    head whose one-to-many branch is gone (fused away) runs one-to-one; a head with no one-to-one branch never does."""
    head = _head(model)
    if head is None or getattr(head, "one2one_cv2", None) is None:
        return bool(getattr(head, "end2end", False)) and getattr(head, "one2one_cv2", None) is not None
    return getattr(head, "cv2", None) is None


def facts_of_module(model, name: str, source: Path | None = None) -> ModelFacts:
    """What a loaded Ultralytics module is (its class, head and names), called ``name``."""
    from ultralytics.nn.tasks import RTDETRDetectionModel

    head = _head(model)
    task = getattr(model, "task", None) or "detect"
    rtdetr = isinstance(model, RTDETRDetectionModel)
    if task not in TASK_FAMILIES:
        raise UsageError(f"{name}: an Ultralytics {type(model).__name__} of task {task!r}, which enginekit does not "
                         f"export (it serves {', '.join(TASK_FAMILIES)})")
    spec = getattr(model, "yaml", None)
    names = getattr(model, "names", None) or {}
    layers = tuple(structure(model))
    end2end = rtdetr or head_end2end(model)
    try:
        stride = int(max(model.stride.tolist()))
    except (AttributeError, TypeError, ValueError):
        stride = 32
    return ModelFacts(name=name, family="rtdetr" if rtdetr else TASK_FAMILIES[task], task=task,
                      architecture=architecture_name(spec) if isinstance(spec, dict) else None, end2end=end2end,
                      last_layer=len(model.model) - 1 if hasattr(model, "model") and hasattr(model.model, "__len__")
                      else None, stride=stride, classes=len(names), source=str(source) if source else None,
                      structure=_digest(layers), layers=layers,
                      kpt_shape=tuple(getattr(head, "kpt_shape", ()) or ()) or None,
                      channels=int(spec.get("channels", 3) or 3) if isinstance(spec, dict) else 3,
                      imgsz=_trained_size(getattr(model, "args", None), stride))


def _trained_size(args, stride: int) -> tuple[int, int] | None:
    """The checkpoint's training size (``imgsz`` of its train args: one side or [h, w]), as Ultralytics keeps it for
    predict, export and val (``Model._reset_ckpt_args``); None where it records none that fits the stride."""
    value = args.get("imgsz") if isinstance(args, dict) else None
    try:
        h, w = (int(v) for v in (value if isinstance(value, (list, tuple)) else (value, value)))
    except (TypeError, ValueError):
        return None
    return (h, w) if h > 0 and w > 0 and not h % stride and not w % stride else None


def _load(path: Path):
    try:
        return load_ultralytics_model(path)
    except EnginekitError:  # refused (exit 2), or layers this Ultralytics cannot run (exit 3): as they are
        raise
    except Exception as exc:  # noqa: BLE001
        raise UsageError(describe_load_error(exc, f"cannot load YOLO checkpoint {path}")) from exc


@lru_cache(maxsize=32)
def _checkpoint_facts(path: Path, size: int, mtime_ns: int) -> ModelFacts:
    return facts_of_module(_load(path), path.stem, path)


def checkpoint_facts(path: Path) -> ModelFacts:
    """What an Ultralytics checkpoint file holds (read once per file and version of it in a process); a one-line
    UsageError where it cannot be loaded."""
    path = Path(path).expanduser().resolve()
    st = path.stat()
    return _checkpoint_facts(path, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16)
def _named_structure(variant: str, task: str, nc: int, kpt_shape: tuple | None, channels: int):
    """The structure (``structure``) of ``variant`` as Ultralytics builds it with ``nc`` classes; None where it
    cannot build it."""
    from ultralytics.nn import tasks

    try:
        spec = tasks.yaml_model_load(f"{variant}.yaml")
    except Exception:  # noqa: BLE001 - no such YAML among Ultralytics' own
        return None
    spec["nc"] = nc
    if kpt_shape:
        spec["kpt_shape"] = list(kpt_shape)
    classes = {"detect": tasks.DetectionModel, "segment": tasks.SegmentationModel, "pose": tasks.PoseModel,
               "obb": tasks.OBBModel, "classify": tasks.ClassificationModel}
    if variant.startswith("rtdetr"):
        cls = tasks.RTDETRDetectionModel
    else:
        cls = classes.get(task) or getattr(tasks, {"semantic": "SemanticSegmentationModel",
                                                    "depth": "DepthModel"}.get(task, ""), None)
    if cls is None:
        return None
    try:
        return structure(cls(spec, ch=channels, nc=nc, verbose=False))
    except Exception:  # noqa: BLE001
        return None


def check_architecture(facts: ModelFacts, variant: str, task: str, file: str) -> None:
    """Refuse (one line, exit 2) a checkpoint given under a name (``variant``, a ``task`` model) that is not what it
    holds: another task, or layers that are not ``variant``'s built with the checkpoint's classes. The refusal
    names what the checkpoint is and a command that works (the file alone). The layers are compared, not the
    YAML's text, so any spelling of the same YAML (renamed, old-style multiples, no scale) matches."""
    use = f"give the file alone (enginekit export {file}), which needs no name"
    if facts.task != task:
        base = re.sub(r"-(seg|pose|obb|cls|sem|depth)$", "", variant)
        own = f"{base}{TASK_SUFFIXES.get(facts.task, '')}"
        raise UsageError(f"{file} is {facts.describe()}, but {variant} is a {task} model: {use}, or the name of its "
                         f"task ({own})")
    want = _named_structure(variant, task, facts.classes or 80, facts.kpt_shape, facts.channels)
    if want is not None and tuple(want) != facts.layers:
        raise UsageError(f"{file} is {facts.describe()}, whose layers are not {variant}'s: {use}")


# -- files Ultralytics wrote: its ONNX metadata_props ----------------------------------------------------------
_DESCRIPTION = re.compile(r"^Ultralytics (?P<name>\S+) model\b")
ULTRALYTICS_DEFAULT_IMGSZ = 640  # its predict and val default (``cfg/default.yaml``)
#: how enginekit's metadata says a model is known by what it is (``ModelFacts``), not by a name it builds:
#: a checkpoint's export, or a file Ultralytics exported
MODEL_SOURCE = "model_source"


def _literal(value):
    """A metadata value as Ultralytics meant it: ONNX metadata_props are ``str()`` of Python values, an engine header
    is JSON (values as they are, dict keys as strings)."""
    import ast

    if isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def is_ultralytics_metadata(meta: dict) -> bool:
    return str(meta.get("author", "")).strip() == "Ultralytics" or bool(_DESCRIPTION.match(str(meta.get("description", ""))))


def adopt_ultralytics_metadata(meta: dict) -> dict[str, str] | None:
    """A file Ultralytics exported (ONNX ``metadata_props``, or an engine's JSON header: ``author``, ``description``,
    ``task``, ``stride``, ``imgsz``, ``names``, ``batch``, ``args``) as enginekit's metadata: the model named by its
    description (``Ultralytics YOLOv8n model trained on ...``), its task, classes, stride and export size. None: not
    Ultralytics'. Partial or contradictory metadata is one ``UsageError`` naming the key."""
    if not is_ultralytics_metadata(meta):
        return None
    where = "its Ultralytics metadata"
    task = meta.get("task")
    if task not in _TASKS:
        raise UsageError(f"{where} names no task ({'task ' + repr(task) if task else 'task missing'}): expected one "
                         f"of {', '.join(_TASKS)}")
    names = _literal(meta.get("names", ""))
    try:
        names = {int(k): str(v) for k, v in names.items()} if isinstance(names, dict) else None
    except (TypeError, ValueError):
        names = None
    if not names:
        raise UsageError(f"{where}: names is not a mapping of class indices to names ({str(meta.get('names'))[:60]!r})")
    try:
        stride = int(float(meta.get("stride", "")))
    except (TypeError, ValueError):
        stride = 0
    if stride <= 0:
        raise UsageError(f"{where}: stride {meta.get('stride')!r} is not a positive number of pixels")
    imgsz = _literal(meta.get("imgsz", ""))
    try:
        h, w = (int(v) for v in (imgsz if isinstance(imgsz, (list, tuple)) else (imgsz, imgsz)))
    except (ValueError, TypeError):
        h = w = 0
    if h <= 0 or w <= 0 or h % stride or w % stride:
        raise UsageError(f"{where}: imgsz {meta.get('imgsz')!r} is not an input size in strides of {stride}")
    found = _DESCRIPTION.match(str(meta.get("description", "")))
    # what Ultralytics called the model: its YAML's name, else its checkpoint's file stem ("people"); a name for
    # output, never a condition (the metadata says what the model is)
    name = found["name"].replace("YOLO", "yolo") if found else "ultralytics-model"
    rtdetr = str(meta.get("head", "")) == "RTDETRDecoder" or name.lower().startswith("rtdetr")
    family = "rtdetr" if rtdetr else TASK_FAMILIES[task]
    args = _literal(meta.get("args", {}))
    args = args if isinstance(args, dict) else {}
    if args.get("dynamic"):  # YOLO(file).predict() runs a file of any H x W at its own default size, not imgsz
        h = w = ULTRALYTICS_DEFAULT_IMGSZ
    out = {"model": name, "family": family, MODEL_SOURCE: "ultralytics", "task": task, "names": str(names),
           "stride": str(stride),
           "export_shape": f"1x{int(meta.get('channels', 3) or 3)}x{h}x{w}", "ultralytics": str(meta.get("version", "?")),
           "end2end": str(_literal(meta.get("end2end", False)) is True or bool(args.get("nms")))}
    if args.get("dynamic"):  # the size its own predictor runs it at, whatever the family's default (classify: 224)
        out["runs_at"] = f"{h}x{w}"
    if args.get("nms"):
        out["nms"] = "True"
    for key in ("kpt_shape", "kpt_names"):  # pose: the keypoints' layout, as Ultralytics records it
        if key in meta:
            out[key] = str(_literal(meta[key]))
    quantize = str(args.get("quantize") or "")  # 8.4: quantize=16 / 8; earlier releases: half / int8
    if args.get("half") or quantize in ("16", "fp16", "half"):
        out["precision"] = "fp16"
    elif args.get("int8") or quantize in ("8", "int8"):
        out["precision"] = "int8"
    for key, value in meta.items():  # what enginekit's stages wrote into the graph since (its precision, INT8 settings)
        if key in ("precision", "enginekit_version") or key.startswith(("int8_", "fp8_", "fp32_")):
            out[key] = value
    return out


def facts_of_metadata(metadata: dict) -> ModelFacts | None:
    """What a graph's (or engine's) metadata says its Ultralytics model is: enginekit's own, or Ultralytics' adopted
    (``adopt_ultralytics_metadata``). None where it names no Ultralytics family and task."""
    family, task = metadata.get("family"), metadata.get("task")
    if task not in TASK_FAMILIES or family not in (TASK_FAMILIES[task], "rtdetr"):
        return None
    names = _literal(metadata.get("names", ""))
    try:
        stride = int(float(metadata.get("stride") or 32))
    except (TypeError, ValueError):
        stride = 32
    layer = str(metadata.get("last_layer", ""))
    return ModelFacts(name=str(metadata.get("model") or "model"), family=family, task=task,
                      architecture=metadata.get("architecture") or None,
                      end2end=str(metadata.get("end2end")) == "True", stride=stride,
                      last_layer=int(layer) if layer.isdigit() else None,
                      classes=len(names) if isinstance(names, dict) else 0)


def ultralytics_header(variant: str, metadata: dict[str, str], profile: dict, precision: str,
                       extra: dict | None = None) -> dict:
    """The JSON metadata Ultralytics writes ahead of an engine's plan, for an engine of ``variant`` built from a graph
    with enginekit's ``metadata`` at ``profile`` (its ``min``/``opt``/``max`` shapes): what ``YOLO("model.engine")``
    reads (task, stride, imgsz, batch, names, end2end, args; kpt_shape for pose). ``extra``: more keys (enginekit's)."""
    import ast

    names = ast.literal_eval(metadata.get("names") or "{}")
    opt, largest, smallest = profile["opt"], profile["max"], profile["min"]
    nms = metadata.get("nms") == "True"
    header = {
        # as its exporter names a model: the YAML's name it records, else the checkpoint's (our name for it)
        "description": f"Ultralytics {(metadata.get('architecture') or variant).replace('yolo', 'YOLO')} model",
        "author": "Ultralytics",  # whose model and metadata layout this is; the engine is enginekit's (``extra``)
        "stride": int(metadata.get("stride") or 32),
        "task": metadata.get("task") or "detect",
        "batch": int(largest[0]),
        "imgsz": [int(opt[2]), int(opt[3])],
        "names": {int(k): str(v) for k, v in names.items()},
        "args": {"batch": int(largest[0]), "dynamic": list(smallest) != list(largest), "half": precision == "fp16",
                 "int8": precision == "int8", "nms": nms},
        "channels": int(opt[1]),
        "end2end": metadata.get("end2end") == "True" or nms,
    }
    if "kpt_shape" in metadata:
        header["kpt_shape"] = list(ast.literal_eval(metadata["kpt_shape"]))
    return {**header, **(extra or {})}
