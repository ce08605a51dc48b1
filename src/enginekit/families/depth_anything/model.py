"""Depth-Anything-V2's model through transformers: its configuration, an exportable forward, original checkpoints.

Three things differ from calling the transformers model as is:
- the head's upsampling size is ``int(patch_h * 14)`` in transformers, a Python int that an
  exporter freezes into the graph; ``ExportableDepthAnything`` upsamples to the input's own
  H/W instead, so H/W stay dynamic;
- any H x W is served (SIZE_POLICY): a side that is not a multiple of 14 is resized in the graph
  (bicubic) up to the next multiple, as the original repository's pipeline does
  (``ensure_multiple_of=14``, lower bound), and the depth comes back at the input's H x W. The
  patch embedding would otherwise floor it (384 px -> 27 patches, 6 px unseen). Measured on six
  photographs (random weights, neck/head re-initialised), against that pipeline run in PyTorch
  (resize the photograph to 392, run, depth bilinear back to 384): in-graph resize rel L2 0.0088
  mean / 0.027 max, AbsRel 0.0062 / 0.019; floor 0.053 / 0.072, AbsRel 0.038 / 0.051. At multiples
  of 14 the resize is the identity;
- checkpoints of the original repository (``depth_anything_v2_vits.pth``) are mapped key by key
  onto the transformers model, every key accounted for;
- run in PyTorch (not traced or exported), the backbone's position embeddings interpolated to an input
  size are kept for that size (``cache_position_embeddings``): DINOv2 interpolates them at every forward,
  one bicubic over 384 channels in FP32 that torch's CUDA kernel gives a single block of threads (2.7 ms of
  the small model's 4.2 ms at 384 x 384 on an H200, a constant of the size).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from enginekit.errors import UsageError

PATCH = 14
SIZE_POLICY = ("any H x W: a side that is not a multiple of 14 is resized in the graph (bicubic) up to the "
               "next multiple (384 -> 392), as the original pipeline does; depth comes back at the input's H x W")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

# ViT size -> (hidden, layers, heads, out_indices, neck sizes, fusion size)
VARIANTS: dict[str, dict] = {
    "small": dict(hidden=384, layers=12, heads=6, out=[3, 6, 9, 12], neck=[48, 96, 192, 384], fusion=64),
    "base": dict(hidden=768, layers=12, heads=12, out=[3, 6, 9, 12], neck=[96, 192, 384, 768], fusion=128),
    "large": dict(hidden=1024, layers=24, heads=16, out=[5, 12, 18, 24], neck=[256, 512, 1024, 1024], fusion=256),
}
HUB_WEIGHTS_FILE = "model.safetensors"
HUB_NAMES = {v: f"depth-anything/Depth-Anything-V2-{v.capitalize()}-hf" for v in VARIANTS}

def make_config(size: str):
    from transformers import DepthAnythingConfig, Dinov2Config

    v = VARIANTS[size]
    backbone = Dinov2Config(
        hidden_size=v["hidden"],
        num_hidden_layers=v["layers"],
        num_attention_heads=v["heads"],
        patch_size=PATCH,
        image_size=518,
        out_indices=v["out"],
        reshape_hidden_states=False,
        layerscale_value=1.0,
    )
    return DepthAnythingConfig(
        backbone_config=backbone,
        neck_hidden_sizes=v["neck"],
        fusion_hidden_size=v["fusion"],
        head_hidden_size=32,
        reassemble_hidden_size=v["hidden"],
        depth_estimation_type="relative",
    )


def exportable_class():
    import torch
    from torch import nn

    class ExportableDepthAnything(nn.Module):
        """transformers' forward, with the head's upsampling size taken from the input."""

        def __init__(self, model):
            super().__init__()
            self.model = model
            cache_position_embeddings(model.backbone.embeddings)

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            m = self.model
            height, width = pixel_values.shape[2], pixel_values.shape[3]
            # up to the next multiple of 14 (symbolic: H/W stay dynamic); the identity at multiples of 14
            inner_h = (height + PATCH - 1) // PATCH * PATCH
            inner_w = (width + PATCH - 1) // PATCH * PATCH
            seen = nn.functional.interpolate(pixel_values, size=(inner_h, inner_w), mode="bicubic", align_corners=False)
            features = m.backbone.forward_with_filtered_kwargs(seen).feature_maps
            hidden = m.neck(features, inner_h // PATCH, inner_w // PATCH)
            head = m.head
            depth = head.conv1(hidden[head.head_in_index])
            depth = nn.functional.interpolate(depth, size=(height, width), mode="bilinear", align_corners=True)
            depth = head.activation1(head.conv2(depth))
            depth = head.activation2(head.conv3(depth)) * head.max_depth
            return depth.squeeze(1)

    return ExportableDepthAnything


def cache_position_embeddings(embeddings) -> None:
    """Keep ``embeddings``' (a transformers DINOv2 ``Dinov2Embeddings``) position embeddings interpolated to an
    input size for that size: the same tensor transformers computes, computed once per size, dtype and device.
    Never while the module is traced or exported (the graph keeps the interpolation: H/W stay dynamic), nor
    where autograd would need it; recomputed when the embeddings' tensor is replaced or written in place."""
    if not getattr(type(embeddings), "keeps_interpolated_positions", False):
        embeddings.__class__ = _caching_embeddings(type(embeddings))


def _tracing() -> bool:
    import torch

    return bool(torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling())


@functools.lru_cache(maxsize=None)
def _caching_embeddings(base: type) -> type:
    import torch

    class CachingEmbeddings(base):
        keeps_interpolated_positions = True

        def interpolate_pos_encoding(self, embeddings, height, width):
            positions = self.position_embeddings
            if _tracing() or (positions.requires_grad and torch.is_grad_enabled()):
                return super().interpolate_pos_encoding(embeddings, height, width)
            key = (int(embeddings.shape[1]), embeddings.dtype, embeddings.device, int(height), int(width))
            kept = self.__dict__.setdefault("_interpolated_positions", {})
            entry = kept.get(key)
            if entry is None or entry[0] is not positions or entry[1] != (positions.data_ptr(), positions._version):
                if len(kept) >= 8:
                    kept.clear()
                value = super().interpolate_pos_encoding(embeddings, height, width)
                entry = kept[key] = (positions, (positions.data_ptr(), positions._version), value)
            return entry[2]

    CachingEmbeddings.__name__ = CachingEmbeddings.__qualname__ = base.__name__
    return CachingEmbeddings


# -- original repository checkpoints ---------------------------------------------------
_ORIGINAL_RULES: list[tuple[str, str]] = [
    (r"pretrained\.cls_token", "backbone.embeddings.cls_token"),
    (r"pretrained\.mask_token", "backbone.embeddings.mask_token"),
    (r"pretrained\.pos_embed", "backbone.embeddings.position_embeddings"),
    (r"pretrained\.patch_embed\.proj\.(.*)", r"backbone.embeddings.patch_embeddings.projection.\1"),
    (r"pretrained\.blocks\.(\d+)\.norm(\d)\.(.*)", r"backbone.encoder.layer.\1.norm\2.\3"),
    (r"pretrained\.blocks\.(\d+)\.attn\.proj\.(.*)", r"backbone.encoder.layer.\1.attention.o_proj.\2"),
    (r"pretrained\.blocks\.(\d+)\.ls(\d)\.gamma", r"backbone.encoder.layer.\1.layer_scale\2.lambda1"),
    (r"pretrained\.blocks\.(\d+)\.mlp\.(fc\d)\.(.*)", r"backbone.encoder.layer.\1.mlp.\2.\3"),
    (r"pretrained\.norm\.(.*)", r"backbone.layernorm.\1"),
    (r"depth_head\.projects\.(\d)\.(.*)", r"neck.reassemble_stage.layers.\1.projection.\2"),
    (r"depth_head\.resize_layers\.(\d)\.(.*)", r"neck.reassemble_stage.layers.\1.resize.\2"),
    (r"depth_head\.scratch\.output_conv1\.(.*)", r"head.conv1.\1"),
    (r"depth_head\.scratch\.output_conv2\.0\.(.*)", r"head.conv2.\1"),
    (r"depth_head\.scratch\.output_conv2\.2\.(.*)", r"head.conv3.\1"),
]


def _map_original_key(key: str) -> list[tuple[str, slice | None]]:
    """Original key -> [(transformers key, slice of the tensor's first dim)]."""
    m = re.fullmatch(r"pretrained\.blocks\.(\d+)\.attn\.qkv\.(weight|bias)", key)
    if m:  # DINOv2 fuses q, k, v; transformers keeps three projections
        i, kind = m.groups()
        return [(f"backbone.encoder.layer.{i}.attention.{p}_proj.{kind}", j) for j, p in enumerate("qkv")]  # type: ignore[misc]
    m = re.fullmatch(r"depth_head\.scratch\.layer(\d)_rn\.(.*)", key)
    if m:
        return [(f"neck.convs.{int(m.group(1)) - 1}.{m.group(2)}", None)]
    m = re.fullmatch(r"depth_head\.scratch\.refinenet(\d)\.(.*)", key)
    if m:  # refinenet4 is the first fusion layer
        layer = 4 - int(m.group(1))
        rest = m.group(2).replace("out_conv", "projection")
        rest = re.sub(r"resConfUnit(\d)\.conv(\d)", r"residual_layer\1.convolution\2", rest)
        return [(f"neck.fusion_stage.layers.{layer}.{rest}", None)]
    for pattern, repl in _ORIGINAL_RULES:
        if re.fullmatch(pattern, key):
            return [(re.sub(pattern, repl, key), None)]
    return []


def convert_original_state_dict(original: dict, target_keys: set[str]) -> dict:
    """Map an original-repository state dict onto transformers keys; every key must be used."""
    out: dict = {}
    unmapped = []
    for key, tensor in original.items():
        targets = _map_original_key(key)
        if not targets:
            unmapped.append(key)
            continue
        for name, part in targets:
            if part is None:
                out[name] = tensor
            else:
                out[name] = tensor.chunk(3, dim=0)[part]
    if unmapped:
        raise UsageError(f"checkpoint has {len(unmapped)} keys with no place in Depth-Anything-V2 (first: {unmapped[0]})")
    missing = sorted(target_keys - set(out))
    if missing:
        raise UsageError(f"checkpoint lacks {len(missing)} Depth-Anything-V2 weights (first: {missing[0]})")
    return out


def to_original_state_dict(hf_state: dict) -> dict:
    """transformers keys -> original-repository keys (for writing checkpoints in that layout)."""
    import torch

    reverse: dict[str, object] = {}
    qkv: dict[tuple[str, str], dict[int, object]] = {}
    probes = _original_key_space(hf_state)
    for orig in probes:
        for name, part in _map_original_key(orig):
            if part is None:
                reverse[orig] = hf_state[name]
            else:
                qkv.setdefault((orig, ""), {})[part] = hf_state[name]
    for (orig, _), parts in qkv.items():
        reverse[orig] = torch.cat([parts[0], parts[1], parts[2]], dim=0)
    return reverse


def _original_key_space(hf_state: dict) -> list[str]:
    """Every original-repository key that corresponds to a transformers state dict."""
    n_layers = 1 + max(int(k.split(".")[3]) for k in hf_state if k.startswith("backbone.encoder.layer."))
    keys = ["pretrained.cls_token", "pretrained.mask_token", "pretrained.pos_embed"]
    keys += [f"pretrained.patch_embed.proj.{p}" for p in ("weight", "bias")]
    for i in range(n_layers):
        for p in ("weight", "bias"):
            keys += [f"pretrained.blocks.{i}.{mod}.{p}" for mod in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")]
        keys += [f"pretrained.blocks.{i}.ls1.gamma", f"pretrained.blocks.{i}.ls2.gamma"]
    keys += [f"pretrained.norm.{p}" for p in ("weight", "bias")]
    for i in range(4):
        keys += [f"depth_head.projects.{i}.{p}" for p in ("weight", "bias")]
        if i != 2:  # the third reassemble stage does not resize
            keys += [f"depth_head.resize_layers.{i}.{p}" for p in ("weight", "bias")]
        keys.append(f"depth_head.scratch.layer{i + 1}_rn.weight")
        for p in ("weight", "bias"):
            keys.append(f"depth_head.scratch.refinenet{i + 1}.out_conv.{p}")
            keys += [f"depth_head.scratch.refinenet{i + 1}.resConfUnit{u}.conv{c}.{p}" for u in (1, 2) for c in (1, 2)]
    for p in ("weight", "bias"):
        keys += [f"depth_head.scratch.output_conv1.{p}", f"depth_head.scratch.output_conv2.0.{p}", f"depth_head.scratch.output_conv2.2.{p}"]
    return keys
