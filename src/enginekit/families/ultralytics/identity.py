"""Which model an Ultralytics checkpoint is: the architecture it records (its model YAML), as a name.

A trainer's ``best.pt`` keeps the YAML its model was built from (``model.yaml``: backbone, head, the
``yaml_file`` it came from and its ``scale``). ``enginekit export best.pt`` reads the model's name from it, as
``yolo export model=best.pt`` does, and a checkpoint given to a named model (``export yolo12n -w yolov8n.pt``)
that is another architecture is refused, naming the one it is: its weights would be loaded into the wrong
graph's name, label and cache entries.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from enginekit.errors import UsageError
from enginekit.families import resolve
from enginekit.families.base import describe_load_error
from enginekit.families.checkpoints import load_ultralytics_model


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
    """The model name a model YAML dict stands for (``yolov8n``, ``yolo11s-seg``): its file's name with its scale,
    as Ultralytics names its models; None where it records no file."""
    stem = Path(str(spec.get("yaml_file") or "")).stem
    if not stem:
        return None
    scale = spec.get("scale")
    if scale and not re.search(rf"\d{re.escape(str(scale))}(?:-|$)", stem):
        stem = re.sub(r"^(yolo(?:v)?\d+)", rf"\g<1>{scale}", stem, count=1)  # yolov8-seg + s -> yolov8s-seg
    return stem


@lru_cache(maxsize=64)
def _named_spec(variant: str) -> dict | None:
    from ultralytics.nn.tasks import yaml_model_load

    try:
        return yaml_model_load(f"{variant}.yaml")
    except Exception:  # noqa: BLE001 - no such YAML among Ultralytics' own
        return None


def same_architecture(spec: dict, variant: str) -> bool:
    """Whether a model YAML dict builds ``variant``: named so (the same name across Ultralytics releases), or the
    same layers at the same scale as ``variant``'s YAML (a copy under another name)."""
    name = architecture_name(spec)
    if name is not None and name.lower() == variant.lower():
        return True
    want = _named_spec(variant)
    return want is not None and [want.get(k) for k in ("backbone", "head", "scale")] == \
        [spec.get(k) for k in ("backbone", "head", "scale")]


def check_architecture(model, variant: str, weights) -> None:
    """Refuse (one line, exit 2) a checkpoint's model that is not ``variant``, naming what it is."""
    spec = getattr(model, "yaml", None)
    if not isinstance(spec, dict) or same_architecture(spec, variant):
        return
    name = architecture_name(spec)
    known = name is not None and _resolvable(name)
    what = f"a {name}" if known else f"built from {spec.get('yaml_file') or 'a YAML of its own'}" + (
        f" at scale {spec['scale']}" if spec.get("scale") else "")
    use = (f"name it {name} (enginekit export {name} -w {Path(str(weights)).name}), or give the file alone "
           f"(enginekit export {Path(str(weights)).name})") if known else \
        f"give the file alone (enginekit export {Path(str(weights)).name}) or the model it was trained as"
    raise UsageError(f"{Path(str(weights)).name} is {what}, not {variant}: {use}")


@lru_cache(maxsize=16)
def _checkpoint_variant(path: Path, size: int, mtime_ns: int) -> str:
    return _read_variant(path)


def checkpoint_variant(path: Path) -> str:
    """The model name a checkpoint file records (for ``export best.pt``); one line where it records none enginekit
    builds by name. Read once per file and version of it in a process."""
    st = Path(path).stat()
    return _checkpoint_variant(Path(path).resolve(), st.st_size, st.st_mtime_ns)


def _read_variant(path: Path) -> str:
    try:
        model = load_ultralytics_model(path)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001

        raise UsageError(describe_load_error(exc, f"cannot load YOLO checkpoint {path}")) from exc
    spec = getattr(model, "yaml", None)
    name = architecture_name(spec) if isinstance(spec, dict) else None
    if name is None or not _resolvable(name):
        raise UsageError(f"{path.name} records no model enginekit builds by name ({(spec or {}).get('yaml_file')}): "
                         "name the model it was trained as (enginekit export yolov8s -w best.pt)")
    return name


def _resolvable(name: str) -> bool:
    try:
        adapter = resolve(name)
    except UsageError:
        return False
    return adapter.family.startswith(("yolo", "rtdetr"))


# -- files Ultralytics wrote: its ONNX metadata_props ----------------------------------------------------------
_DESCRIPTION = re.compile(r"^Ultralytics (?P<name>\S+) model\b")
ULTRALYTICS_DEFAULT_IMGSZ = 640  # its predict and val default (``cfg/default.yaml``)
#: Ultralytics' tasks its exports record, and what enginekit's runtime serves for each
_TASKS = ("detect", "segment", "pose", "obb", "classify", "semantic", "depth")


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
    name = found["name"].lower() if found else None
    if name is None or not _resolvable(name):
        raise UsageError(f"{where} names no model enginekit builds (description {str(meta.get('description'))[:60]!r})")

    adapter = resolve(name)
    if adapter.task != task:
        raise UsageError(f"{where} is contradictory: {name} is a {adapter.task} model, its task says {task}")
    args = _literal(meta.get("args", {}))
    args = args if isinstance(args, dict) else {}
    if args.get("dynamic"):  # YOLO(file).predict() runs a file of any H x W at its own default size, not imgsz
        h = w = ULTRALYTICS_DEFAULT_IMGSZ
    out = {"model": name, "family": adapter.family, "task": task, "names": str(names), "stride": str(stride),
           "export_shape": f"1x{int(meta.get('channels', 3) or 3)}x{h}x{w}", "ultralytics": str(meta.get("version", "?")),
           "end2end": str(_literal(meta.get("end2end", False)) is True or bool(args.get("nms")))}
    if args.get("nms"):
        out["nms"] = "True"
    for key in ("kpt_shape", "kpt_names"):  # pose: the keypoints' layout, as Ultralytics records it
        if key in meta:
            out[key] = str(_literal(meta[key]))
    if args.get("half"):
        out["precision"] = "fp16"
    elif args.get("int8") or args.get("quantize"):
        out["precision"] = "int8"
    for key, value in meta.items():  # what enginekit's stages wrote into the graph since (its precision, INT8 settings)
        if key in ("precision", "enginekit_version") or key.startswith(("int8_", "fp8_", "fp32_")):
            out[key] = value
    return out


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
        "description": f"Ultralytics {variant.replace('yolo', 'YOLO')} model",  # as its exporter names a model
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
