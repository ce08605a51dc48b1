"""What torchvision's and timm's common heads are, so their names need nothing more.

A small table, data not code: each row matches model names (a regular expression, per library) and says
the task, the outputs and their meaning, the input size and dynamic axes, the preprocessing, the class
count and names, and the builder's arguments. The first matching row wins; what a user declares
(``families.torch_models.spec``) overrides it. A model no row matches is ``raw`` (parity only) until its
task is declared.

Preprocessing follows each library's own evaluation transforms: torchvision's classifiers resize the
shorter side to 256 and crop 224 (``crop``, 0.875); its segmentation models take the image as is,
normalised (``stretch`` to the declared size here); timm's come from the model's ``pretrained_cfg``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from enginekit.families.torch_models.spec import ModelSpec

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
ANY_SIZE = ("batch", "height", "width")
FIXED_SIZE = ("batch",)


@dataclass(frozen=True)
class Row:
    library: str  # torchvision | timm
    pattern: str  # regular expression over the model name (fullmatch)
    spec: dict[str, Any]  # ModelSpec fields
    build: dict[str, Any] = field(default_factory=dict)  # builder keyword arguments
    names: str = ""  # class names: "voc" (torchvision's 21 segmentation classes) | "imagenet" | ""
    crop_fraction: float = 0.875  # "crop": the crop's share of the resized shorter side
    multiple: int = 1  # sides a multiple of this
    note: str = ""


SEGMENTATION = {"task": "semantic", "size": (512, 512), "dynamic": ANY_SIZE, "mean": IMAGENET_MEAN,
                "std": IMAGENET_STD, "resize": "stretch", "channels": "rgb", "classes": 21}
CLASSIFIER = {"task": "classify", "outputs": (("logits", "logits"),), "size": (224, 224), "mean": IMAGENET_MEAN,
              "std": IMAGENET_STD, "resize": "crop", "channels": "rgb", "classes": 1000}

ROWS: tuple[Row, ...] = (
    # torchvision segmentation: an OrderedDict {out, aux} of per-pixel logits at the input's size; the
    # published weights carry the auxiliary head (aux_loss=True), lraspp has none
    Row("torchvision", r"(deeplabv3|fcn)_.*", {**SEGMENTATION, "outputs": (("out", "logits"), ("aux", "logits"))},
        {"aux_loss": True}, names="voc", note="torchvision segmentation (out, aux)"),
    Row("torchvision", r"lraspp_.*", {**SEGMENTATION, "outputs": (("out", "logits"),)}, names="voc",
        note="torchvision segmentation (out)"),
    # torchvision classifiers: transformers take their training size only
    Row("torchvision", r"(vit|swin|maxvit)_.*", {**CLASSIFIER, "dynamic": FIXED_SIZE}, names="imagenet",
        note="torchvision classifier, fixed size"),
    Row("torchvision", r"inception_v3", {**CLASSIFIER, "size": (299, 299), "dynamic": ANY_SIZE}, names="imagenet",
        note="torchvision classifier"),
    Row("torchvision", r"(alexnet|convnext|densenet|efficientnet|googlenet|mnasnet|mobilenet|regnet|resnet|"
                       r"resnext|shufflenet|squeezenet|vgg|wide_resnet).*",
        {**CLASSIFIER, "dynamic": ANY_SIZE}, names="imagenet", note="torchvision classifier"),
    # timm: every model it builds is an image classifier by default; its pretrained_cfg says the rest
    Row("timm", r".*", {**CLASSIFIER}, names="imagenet", note="timm classifier (pretrained_cfg)"),
)


def row_for(library: str, name: str) -> Row | None:
    for row in ROWS:
        if row.library == library and re.fullmatch(row.pattern, name):
            return row
    return None


def defaults(library: str, name: str) -> tuple[ModelSpec, Row | None]:
    """The declaration a library model comes with (empty where the table has no row)."""
    row = row_for(library, name)
    if row is None:
        return ModelSpec(), None
    fields = dict(row.spec)
    if library == "timm":
        fields.update(_timm_config(name))
    return ModelSpec(**fields), row


def _timm_config(name: str) -> dict[str, Any]:
    """Input size, normalisation, crop and fixed size from timm's ``pretrained_cfg`` (no download)."""
    try:
        import timm

        cfg = timm.models.get_pretrained_cfg(name)
    except Exception:  # noqa: BLE001 - an unknown name is refused elsewhere, with its own message
        return {}
    if cfg is None:
        return {}
    found: dict[str, Any] = {}
    size = getattr(cfg, "input_size", None)
    if size and len(size) == 3:
        found["size"] = (int(size[1]), int(size[2]))
    for key in ("mean", "std"):
        value = getattr(cfg, key, None)
        if value and len(value) == 3:
            found[key] = tuple(float(v) for v in value)
    found["dynamic"] = FIXED_SIZE if getattr(cfg, "fixed_input_size", False) else ANY_SIZE
    classes = getattr(cfg, "num_classes", None)
    if classes:
        found["classes"] = int(classes)
    return found


def crop_fraction(library: str, name: str) -> float:
    row = row_for(library, name)
    if library == "timm":
        try:
            import timm

            cfg = timm.models.get_pretrained_cfg(name)
            if cfg is not None and getattr(cfg, "crop_pct", None):
                return float(cfg.crop_pct)
        except Exception:  # noqa: BLE001
            pass
    return row.crop_fraction if row else 0.875


def class_names(kind: str, count: int) -> dict[int, str]:
    """The class names of a row (``names``) when the model has that many classes; else {}."""
    if kind == "voc" and count == 21:
        return dict(enumerate(_torchvision_categories("deeplabv3_resnet50")))
    if kind == "imagenet" and count == 1000:
        return dict(enumerate(_torchvision_categories("resnet18")))
    return {}


def _torchvision_categories(model: str) -> list[str]:
    """Category names torchvision ships with its weights' metadata (no download)."""
    try:
        import torchvision

        return list(torchvision.models.get_model_weights(model).DEFAULT.meta["categories"])
    except Exception:  # noqa: BLE001
        return []
