"""Small Ultralytics models of every task whose outputs say something, for gates that must be able to fail.

A randomly initialised YOLO head is near constant: class scores sit at 1e-4 (nothing at the usual
0.25), a classifier's probabilities are uniform to 1e-8, a semantic map holds one class, depth
varies by 0.03%. A gate comparing those compares nothing. Training a model of each task costs
minutes per task on a small CPU, so these models take the architecture with seeded random
weights, few classes, and rescale the last layer of each task branch from its own outputs on the
embedded photographs (an affine map of the layer: weights and bias, nothing else) so that:
class scores spread with a few instances above 0.25 per image, class probabilities have a clear
top-1, the semantic map holds several classes, and depth spans a range. Everything before that
layer is the random network, so ONNX Runtime, FP16 and INT8 graphs see realistic activations.
Checkpoints are written in Ultralytics' format and loaded back through ``--weights``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: name -> number of classes the test model is built with (None: the architecture's own)
CLASSES = {"yolo11n-seg": 3, "yolo11n-pose": 1, "yolo11n-obb": 3, "yolo11n-cls": 5, "yolo26n-sem": 4,
           "yolo26n-depth": None, "yolo26n-seg": 3, "yolo26n": 3, "yolo11n": 3, "rtdetr-l": 3}


def _photos(hw: tuple[int, int], adapter) -> np.ndarray:
    from enginekit.images import load_images

    return np.concatenate([adapter.preprocess(im, hw) for im in load_images(None, limit=4).images])


def _affine(layer, outputs: "torch.Tensor", *, std: float, mean: float, dim: int = 1) -> None:
    """Rescale ``layer`` (Conv2d or Linear) so its outputs over the photographs have ``mean``/``std``."""
    import torch

    with torch.no_grad():
        reduce = [d for d in range(outputs.ndim) if d != dim]
        mu, sigma = outputs.mean(dim=reduce), outputs.std(dim=reduce).clamp_min(1e-12)
        k = std / sigma
        shape = (-1,) + (1,) * (layer.weight.ndim - 1)
        layer.weight.mul_(k.view(shape))
        bias = layer.bias if layer.bias is not None else torch.zeros_like(mu)
        layer.bias = torch.nn.Parameter((bias - mu) * k + mean)


def _last_conv(module):
    import torch

    return [m for m in module.modules() if isinstance(m, torch.nn.Conv2d)][-1]


def _spread(model, batch: np.ndarray) -> None:
    """Give each task branch's last layer outputs that spread (see the module's docstring)."""
    import torch
    from ultralytics.nn.modules.head import Classify, Depth, Detect, RTDETRDecoder, SemanticSegment

    head = model.model[-1]
    targets: list[tuple] = []  # (layer, std, mean, dim)
    if isinstance(head, Detect):
        for branch, std, mean in (("cv2", 1.5, 0.0), ("one2one_cv2", 1.5, 0.0), ("cv3", 1.5, -7.0),
                                  ("one2one_cv3", 1.5, -7.0), ("cv4", 1.0, 0.0), ("one2one_cv4", 1.0, 0.0)):
            for seq in getattr(head, branch, None) or []:
                targets.append((_last_conv(seq), std, mean, 1))
        if getattr(head, "proto", None) is not None:  # prototypes that vary across the image
            targets.append((_last_conv(head.proto), 2.0, 0.0, 1))
    elif isinstance(head, RTDETRDecoder):
        targets += [(head.dec_score_head[-1], 1.5, -4.0, -1), (head.enc_score_head, 1.5, -4.0, -1)]
    elif isinstance(head, Classify):
        targets.append((head.linear, 1.0, 0.0, 1))
    elif isinstance(head, SemanticSegment):
        targets.append((head.classifier[-1], 2.0, 0.0, 1))
    elif isinstance(head, Depth):
        targets.append((head.head[-1], 0.6, 1.0, 1))
    model.eval()
    for layer, std, mean, dim in targets:  # one at a time: each from the outputs it now sees
        seen = []
        hook = layer.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
        with torch.no_grad():
            model(torch.from_numpy(batch))
        hook.remove()
        out = torch.cat([s.reshape(-1, s.shape[dim]) if dim == -1 else s.movedim(dim, -1).reshape(-1, s.shape[dim])
                         for s in seen])
        _affine(layer, out, std=std, mean=mean, dim=1)


def task_checkpoint(name: str, folder: Path, hw: tuple[int, int] = (160, 160), seed: int = 0) -> Path:
    """An Ultralytics checkpoint of ``name`` with outputs that spread (cached in ``folder``)."""
    path = folder / f"{name}-spread-{hw[0]}x{hw[1]}-{seed}.pt"
    if path.exists():
        return path
    import torch
    from ultralytics import YOLO

    from enginekit.families import resolve
    from enginekit.families.base import seed_everything

    adapter = resolve(name)
    seed_everything(seed)
    nc = CLASSES.get(name)
    model = YOLO(f"{name}.yaml", task=adapter.task).model
    if nc is not None:
        model = type(model)(model.yaml, nc=nc, verbose=False)
        model.names = {i: f"class{i}" for i in range(nc)}
    model.task = adapter.task
    _spread(model, _photos(hw, adapter))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model, "train_args": {}}, tmp)
    tmp.rename(path)
    return path
