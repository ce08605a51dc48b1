"""Depth-Anything-V2 (small, base, large) through transformers: the family (``depth-anything-v2``).

The model itself (configuration, the exportable forward that keeps H/W dynamic, original-repository
checkpoints) is in ``model``; pre/postprocessing of the runtime in ``runtime``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from enginekit.hashing import sha256_file
from enginekit.errors import UsageError
from enginekit.families.base import (
    LoadedModel,
    ModelAdapter,
    Tolerance,
    WeightsSource,
    check_weights_file,
    describe_load_error,
    folder_sha256,
    seed_everything,
)
from enginekit.families.depth_anything.model import (
    HUB_NAMES,
    HUB_WEIGHTS_FILE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    PATCH,
    SIZE_POLICY,
    VARIANTS,
    exportable_class,
    convert_original_state_dict,
    make_config,
    to_original_state_dict,
)
from enginekit.families.depth_anything.runtime import DepthProcessor
from enginekit.families.evaluation import DepthEvaluation
from enginekit.families.registry import register
from enginekit.families.types import FamilyInfo
from enginekit.shapes import InputConstraint

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



@register
class DepthAnythingAdapter(DepthEvaluation, ModelAdapter):
    family = "depth-anything-v2"
    task = "depth"
    framework = "transformers"
    weights_folders = True  # a transformers model folder
    aliases = {"depth": "depth-anything-v2-small", "depth-anything-v2": "depth-anything-v2-small"}
    example = "depth-anything-v2-small"
    processor = DepthProcessor
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
        module = exportable_class()(model.float().eval()).eval()
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
        except Exception as cause:  # noqa: BLE001
            raise UsageError(
                f"cannot download {hub} (offline?): pass --weights PATH (a .pth, .safetensors or "
                "model folder), or --random-init for structure-only work"
            ) from cause

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
            except Exception as cause:  # noqa: BLE001
                raise UsageError(
                    f"cannot download {hub} (offline?): pass --weights PATH (a .pth, .safetensors or "
                    "model folder), or --random-init for structure-only work"
                ) from cause
            return model, WeightsSource("hub", hub, sha256_file(downloaded))
        if weights.is_dir():
            try:
                model = DepthAnythingForDepthEstimation.from_pretrained(str(weights), local_files_only=True)
            except Exception as exc:  # noqa: BLE001
                raise UsageError(describe_load_error(exc, f"cannot load model folder {weights}")) from exc
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
            from enginekit.families.checkpoints import state_dict_refusal

            raise state_dict_refusal(path, "Depth-Anything weights (a state dict or safetensors)", exc) from exc
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
