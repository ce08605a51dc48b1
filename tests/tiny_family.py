"""A family defined outside enginekit: a two-layer conv net that labels each pixel by its dominant colour.

Importing this module registers it (``families.registry.register``); nothing in enginekit names it. It
declares only what ``families.interface`` asks for and reuses evaluation and runtime processing by task
(``SemanticEvaluation``, ``SemanticMaps`` on ``ImageProcessor``). tests/test_family_interface.py exports
it with ``enginekit export``, verifies it, and runs it with ``enginekit.load``.

The net: a 3x3 convolution that averages each colour channel (+ and -), ReLU, and a 1x1 convolution whose
logit for class c is 6 x (channel c - the mean of the channels): class 0/1/2 where red/green/blue
dominates. ``--random-init`` adds seeded noise (std 0.05) to every weight, so the seed matters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from enginekit.errors import UsageError
from enginekit.families import ModelAdapter, register
from enginekit.families.base import Tolerance, check_weights_file
from enginekit.families.types import LoadedModel, WeightsSource
from enginekit.families.evaluation import SemanticEvaluation
from enginekit.families.processing import ImageProcessor, SemanticMaps
from enginekit.families.types import FamilyInfo
from enginekit.shapes import InputConstraint

NAME = "tiny-colours"


def colour_net(seed: int | None):
    import torch
    from torch import nn

    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 3, 1))
    with torch.no_grad():
        w1 = torch.zeros(6, 3, 3, 3)
        for c in range(3):
            w1[c, c], w1[c + 3, c] = 1 / 9, -1 / 9
        w2 = torch.zeros(3, 6, 1, 1)
        for c in range(3):
            w2[:, c, 0, 0], w2[:, c + 3, 0, 0] = -2.0, 2.0
            w2[c, c, 0, 0], w2[c, c + 3, 0, 0] = 4.0, -4.0
        net[0].weight.copy_(w1)
        net[0].bias.zero_()
        net[2].weight.copy_(w2)
        net[2].bias.zero_()
        if seed is not None:
            g = torch.Generator().manual_seed(seed)
            for p in net.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return net.eval()


class TinyProcessor(SemanticMaps, ImageProcessor):
    """Stretched to the network's size, 0..1 (as ``TinyColoursAdapter.preprocess``); a class per pixel back."""


@register
class TinyColoursAdapter(SemanticEvaluation, ModelAdapter):
    family = NAME
    task = "semantic"
    framework = "torch"
    example = NAME
    processor = TinyProcessor
    input_name = "images"
    output_names = ("logits",)
    default_input = (1, 3, 64, 64)
    dynamic_axes = {"images": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch", 2: "height", 3: "width"}}
    input_description = "NCHW RGB float32 in [0,1], stretched to H x W"

    @classmethod
    def matches(cls, name: str) -> bool:
        return name == NAME

    @classmethod
    def describe(cls) -> FamilyInfo:
        return FamilyInfo(cls.family, cls.task, [NAME], "1x3x64x64 (dynamic batch, H, W)", "a state dict (.pt)",
                          "test family: the dominant colour of each pixel")

    @property
    def constraint(self) -> InputConstraint:
        return InputConstraint(self.input_name, 3, 1, self.variant)

    def tolerance(self, precision: str) -> Tolerance:
        return {"fp32": Tolerance(1e-5, 0.999999), "fp16": Tolerance(2e-2, 0.999)}.get(precision, Tolerance(0.25, 0.95))

    def load(self, weights: Path | None, *, random_init: bool, seed: int) -> LoadedModel:
        import torch

        if random_init:
            return LoadedModel(colour_net(seed), NAME, WeightsSource("random", f"{NAME}@{seed}"))
        if weights is None:
            raise UsageError(f"{NAME} has no hub weights: pass --weights or --random-init")
        source = check_weights_file(weights)
        net = colour_net(None)
        net.load_state_dict(torch.load(str(weights), map_location="cpu", weights_only=True))
        return LoadedModel(net, NAME, source)

    def save_checkpoint(self, loaded: LoadedModel, path: Path) -> None:
        import torch

        torch.save(loaded.module.state_dict(), path)

    def preprocess(self, image_rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        import cv2

        resized = cv2.resize(image_rgb, (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
        return (np.ascontiguousarray(resized.transpose(2, 0, 1), dtype=np.float32) / 255.0)[None]
