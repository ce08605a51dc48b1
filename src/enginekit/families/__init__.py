"""Model registry: a name on the command line -> the adapter of its family.

This is the only place that knows which families exist; importing it stays cheap
(adapters import torch, ultralytics or transformers inside their methods).
"""

from __future__ import annotations

from dataclasses import dataclass

from enginekit.errors import UsageError
from enginekit.families.base import LoadedModel, ModelAdapter, Tolerance

ALIASES = {"depth": "depth-anything-v2-small", "depth-anything-v2": "depth-anything-v2-small"}


@dataclass(frozen=True)
class FamilyInfo:
    family: str
    variants: list[str]
    default_input: str
    weights: str
    note: str


def resolve(name: str) -> ModelAdapter:
    """Adapter for a model name, or a one-line UsageError listing what is known."""
    from enginekit.families.depth_anything import VARIANTS, DepthAnythingAdapter
    from enginekit.families.yolo import YoloAdapter

    canonical = ALIASES.get(name.lower(), name.lower())
    if canonical.startswith("depth-anything-v2-") and canonical.rsplit("-", 1)[-1] in VARIANTS:
        return DepthAnythingAdapter(canonical)
    if YoloAdapter.matches(canonical):
        return YoloAdapter(canonical)
    raise UsageError(
        f"unknown model {name!r}: expected a YOLO detector name (yolo12n, yolo11s, yolov8m, ...), "
        "depth-anything-v2-small|base|large, or depth; `enginekit models` lists them"
    )


def families() -> list[FamilyInfo]:
    from enginekit.families.depth_anything import VARIANTS
    from enginekit.families.yolo import known_variants

    return [
        FamilyInfo(
            "yolo",
            known_variants(),
            "1x3x640x640 (dynamic batch)",
            "Ultralytics .pt checkpoint, or <name>.pt from the Ultralytics hub",
            "any detector Ultralytics builds by name",
        ),
        FamilyInfo(
            "depth-anything-v2",
            [f"depth-anything-v2-{v}" for v in VARIANTS],
            "1x3x518x518 (dynamic batch, H, W; multiples of 14)",
            "original .pth, transformers .safetensors/.pth/folder, or the Hugging Face hub",
            "alias: depth = depth-anything-v2-small",
        ),
    ]


__all__ = ["FamilyInfo", "LoadedModel", "ModelAdapter", "Tolerance", "families", "resolve"]
