"""Depth-Anything-V2 (small, base, large) through transformers.

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
  onto the transformers model, every key accounted for.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from enginekit.cache import sha256_file
from enginekit.errors import UsageError
from enginekit.families.base import (
    LoadedModel,
    ModelAdapter,
    OutputPart,
    Tolerance,
    WeightsSource,
    check_weights_file,
    describe_load_error,
    folder_sha256,
    seed_everything,
)
from enginekit.families.registry import FamilyInfo, register
from enginekit.shapes import InputConstraint

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

# Measured 2026-11-26, ONNX Runtime CPU (2-core CPU) against PyTorch FP32, Depth-Anything-V2-small with
# random weights (neck and head re-initialised), 1x3x266x266, 4 embedded photographs + 1 random input:
#   fp32 (simplified): rel L2 2.9e-7, cosine 1 - 4e-14, AbsRel 1.9e-7
#   fp16 (AutoCast):   rel L2 2.7e-4, cosine 1 - 2e-8,  AbsRel 1.7e-4, delta1 1.0
#   int8 (entropy, 8 embedded photographs): rel L2 0.044, cosine 0.9996, AbsRel 0.016, delta1 1.0
# Limits leave ~20x (fp16) and ~2-3x (int8) over those figures; trained weights and GPU kernels
# round differently, so the margins are wider than the measurement's spread.
_TOLERANCES = {
    "fp32": Tolerance(rel_l2=1e-5, cosine=0.999999),
    "fp16": Tolerance(rel_l2=5e-3, cosine=0.9999),
    "int8": Tolerance(rel_l2=0.1, cosine=0.995),
    "fp8": Tolerance(rel_l2=0.1, cosine=0.995),
}


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


def _exportable_class():
    import torch
    from torch import nn

    class ExportableDepthAnything(nn.Module):
        """transformers' forward, with the head's upsampling size taken from the input."""

        def __init__(self, model):
            super().__init__()
            self.model = model

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


@register
class DepthAnythingAdapter(ModelAdapter):
    family = "depth-anything-v2"
    weights_folders = True  # a transformers model folder
    task = "depth"
    framework = "transformers"
    aliases = {"depth": "depth-anything-v2-small", "depth-anything-v2": "depth-anything-v2-small"}
    example = "depth-anything-v2-small"
    picture_kind = "depth"
    runtime_processor = "enginekit.runtime.depth:DepthProcessor"
    # DINOv2's attention exports as MatMul-Softmax-MatMul; ONNX Runtime's CUDA provider runs it fused
    # (com.microsoft.MultiHeadAttention) from a rewritten copy of the graph
    fusable_attention = True
    input_name = "pixel_values"
    output_names = ("depth",)
    default_input = (1, 3, 518, 518)
    dynamic_axes = {
        "pixel_values": {0: "batch", 2: "height", 3: "width"},
        "depth": {0: "batch", 1: "height", 2: "width"},
    }
    # Position-embedding resize: bicubic in FP16 shifts the embeddings (transformers keeps it
    # FP32 for that reason), and ONNX Runtime's CPU Resize refuses FP16 cubic downsampling.
    fp16_keep_fp32 = (r"/backbone/embeddings/.*",)
    # The depth head's three convolutions (exported at the top scope as /conv1../conv3) and the
    # patch embedding stay out of INT8.
    int8_exclude = (r"/conv[123]/.*", r"/backbone/embeddings/.*")
    input_description = (
        "NCHW RGB float32, bicubic resize to HxW (any size; the graph rounds sides up to multiples of 14), /255, "
        "normalised with ImageNet mean (0.485,0.456,0.406) and std (0.229,0.224,0.225)"
    )

    # AbsRel / delta1 after least-squares scale and shift (measured above: fp16 AbsRel 1.7e-4,
    # int8 0.016; delta1 1.0 for both, as random weights' depth spreads only ~7% around its mean)
    task_gates = {
        "fp32": {"abs_rel": ("<=", 1e-3), "delta1": (">=", 0.999)},
        "fp16": {"abs_rel": ("<=", 0.01), "delta1": (">=", 0.99)},
        "int8": {"abs_rel": ("<=", 0.05), "delta1": (">=", 0.95)},
        "fp8": {"abs_rel": ("<=", 0.05), "delta1": (">=", 0.95)},
    }

    def output_parts(self, metadata=None):
        return (OutputPart("depth", "depth", kind="depth"),)

    def task_metrics(self, reference, candidate, metadata, options=None):
        from enginekit.compare.tasks import depth_metrics

        return depth_metrics(reference["depth"], candidate["depth"])

    def nothing_to_compare(self, task):
        return "the reference depth has no pixels above 1e-3 of its maximum"

    def picture_map(self, outputs, metadata):
        return outputs["depth"][0]

    @classmethod
    def matches(cls, name: str) -> bool:
        return name.startswith("depth-anything-v2-") and name.rsplit("-", 1)[-1] in VARIANTS

    @classmethod
    def describe(cls) -> FamilyInfo:
        return FamilyInfo(cls.family, cls.task, [f"depth-anything-v2-{v}" for v in VARIANTS],
                          "1x3x518x518 (dynamic batch, H, W; any size: a side that is not a multiple of 14 is "
                          "resized in the graph up to the next one, depth at the input size)",
                          "original .pth, transformers .safetensors/.pth/folder, or the Hugging Face hub",
                          "alias: depth = depth-anything-v2-small")

    @property
    def size(self) -> str:
        return self.variant.rsplit("-", 1)[-1]

    size_note = SIZE_POLICY

    @property
    def constraint(self) -> InputConstraint:
        # any H x W (SIZE_POLICY): the graph resizes a side that is not a multiple of 14 itself
        return InputConstraint(self.input_name, 3, 1, self.variant)

    def tolerance(self, precision: str) -> Tolerance:
        return _TOLERANCES[precision]

    # -- loading ------------------------------------------------------------------------
    def load(self, weights: Path | None, *, random_init: bool, seed: int) -> LoadedModel:
        model, source = self._load_transformers_model(weights, random_init=random_init, seed=seed)
        module = _exportable_class()(model.float().eval()).eval()
        for p in module.parameters():
            p.requires_grad = False
        return LoadedModel(module, self.variant, source, {"patch_size": str(PATCH), "input_sizes": SIZE_POLICY})

    def hub_weights(self) -> Path:
        """The local copy of the hub repository's weights file (downloaded if need be): its content,
        not the repository name, keys every stage of a hub model."""
        hub = HUB_NAMES[self.size]
        try:
            from huggingface_hub import hf_hub_download

            return Path(hf_hub_download(hub, HUB_WEIGHTS_FILE))
        except Exception:  # noqa: BLE001
            raise UsageError(
                f"cannot download {hub} (offline?): pass --weights PATH (a .pth, .safetensors or "
                "model folder), or --random-init for structure-only work"
            ) from None

    def _load_transformers_model(self, weights: Path | None, *, random_init: bool, seed: int):
        from transformers import DepthAnythingForDepthEstimation

        if random_init:
            seed_everything(seed)
            model = DepthAnythingForDepthEstimation(make_config(self.size))
            # transformers' init leaves the depth output near 1e-5, where relative errors say
            # nothing; PyTorch's default layer init of neck and head brings it near 0.1.
            for sub in (model.neck, model.head):
                for layer in sub.modules():
                    if hasattr(layer, "reset_parameters"):
                        layer.reset_parameters()
            return model, WeightsSource("random", f"{self.variant}@{seed}")
        if weights is None:
            hub = HUB_NAMES[self.size]
            downloaded = self.hub_weights()
            try:
                model = DepthAnythingForDepthEstimation.from_pretrained(hub)
            except Exception:  # noqa: BLE001
                raise UsageError(
                    f"cannot download {hub} (offline?): pass --weights PATH (a .pth, .safetensors or "
                    "model folder), or --random-init for structure-only work"
                ) from None
            return model, WeightsSource("hub", hub, sha256_file(downloaded))
        if weights.is_dir():
            try:
                model = DepthAnythingForDepthEstimation.from_pretrained(str(weights), local_files_only=True)
            except Exception as exc:  # noqa: BLE001
                raise UsageError(describe_load_error(exc, f"cannot load model folder {weights}")) from None
            digest = folder_sha256(weights)
            return model, WeightsSource("file", str(weights), digest)
        source = check_weights_file(weights)
        state = self._read_state_dict(weights)
        model = DepthAnythingForDepthEstimation(make_config(self.size))
        target = model.state_dict()
        if any(k.startswith("pretrained.") for k in state):
            state = convert_original_state_dict(state, set(target))
        missing = sorted(set(target) - set(state))
        unexpected = sorted(set(state) - set(target))
        if missing or unexpected:
            first = (missing or unexpected)[0]
            raise UsageError(
                f"{weights} does not match {self.variant}: {len(missing)} missing, "
                f"{len(unexpected)} unexpected keys (first: {first})"
            )
        bad = [k for k in target if tuple(target[k].shape) != tuple(state[k].shape)]
        if bad:
            raise UsageError(
                f"{weights} does not match {self.variant}: {bad[0]} has shape "
                f"{tuple(state[bad[0]].shape)}, expected {tuple(target[bad[0]].shape)}"
            )
        model.load_state_dict(state)
        return model, source

    @staticmethod
    def _read_state_dict(path: Path) -> dict:
        try:
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                return load_file(str(path))
            import torch

            # weights_only: a state dict needs no code from the file
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise UsageError(describe_load_error(exc, f"cannot read checkpoint {path}")) from None
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict):
            raise UsageError(f"{path} holds a {type(state).__name__}, not a state dict")
        return state

    def save_checkpoint(self, loaded: LoadedModel, path: Path, *, layout: str = "transformers") -> None:
        """Write the model's weights as a state dict, in transformers or original-repo layout."""
        import torch

        state = {k: v.clone() for k, v in loaded.module.model.state_dict().items()}
        if layout == "original":
            state = to_original_state_dict(state)
        if path.suffix == ".safetensors":
            from safetensors.torch import save_file

            save_file(state, str(path))
        else:
            torch.save(state, path)

    # -- inputs -------------------------------------------------------------------------
    def preprocess(self, image_rgb: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
        import cv2

        resized = cv2.resize(image_rgb, (hw[1], hw[0]), interpolation=cv2.INTER_CUBIC)
        x = (resized.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
        return np.ascontiguousarray(x.transpose(2, 0, 1))[None]

    def random_inputs(self, shape, seed: int) -> np.ndarray:
        # standard-normal pixels: what normalised images look like
        return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
