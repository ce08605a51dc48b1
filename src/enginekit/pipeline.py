"""The pipeline's stages as cached functions from files to a file.

    model + weights --export--> ONNX fp32 --simplify--> ONNX --fp16 / int8--> ONNX --build--> plan

Each stage's result is a cache entry keyed by everything that determines it (never a path or
a time), so a second run with the same inputs does no work and loads no model: the keys of the
first stages need only names, hashes and versions.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass, field
from functools import cached_property
from importlib import metadata
from pathlib import Path

import numpy as np

from enginekit import __version__
from enginekit.images import ImageSet, load_images
from enginekit.cache import Cache, Entry, key_for, sha256_file
from enginekit.errors import UsageError
from enginekit.models import ModelAdapter, resolve
from enginekit.models.base import LoadedModel, WeightsSource, file_sha256
from enginekit.shapes import Shape, format_shape
from enginekit.ui import step

ONNX_FILE = "model.onnx"


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


@dataclass
class Artifact:
    """A stage's output: the file inside its cache entry, and how it was obtained."""

    stage: str
    entry: Entry
    status: str  # hit | miss | corrupt | forced

    @property
    def path(self) -> Path:
        return self.entry.file(ONNX_FILE)

    @property
    def sha256(self) -> str:
        return self.entry.manifest["files"][ONNX_FILE]["sha256"]


@dataclass
class ModelRequest:
    """Which model, with which weights; enough to key every stage without loading it."""

    name: str
    weights: Path | None = None
    random_init: bool = False
    seed: int = 0
    adapter: ModelAdapter = field(init=False)

    def __post_init__(self) -> None:
        self.adapter = resolve(self.name)
        if self.weights is not None and self.random_init:
            raise UsageError("--weights and --random-init exclude each other")
        if self.weights is not None and not self.weights.exists():
            raise UsageError(f"weights file not found: {self.weights}")

    @cached_property
    def weights_identity(self) -> str:
        if self.random_init:
            return f"random:{self.adapter.variant}@{self.seed}"
        if self.weights is not None:
            if self.weights.is_dir():
                from enginekit.models.depth_anything import _folder_digest

                return f"sha256:{_folder_digest(self.weights)}"
            return f"sha256:{file_sha256(self.weights)}"
        return f"hub:{self.adapter.variant}"

    @property
    def subject(self) -> str:
        return self.adapter.variant


class Pipeline:
    """Runs the stages for one model request, loading the model only when a stage misses."""

    def __init__(self, request: ModelRequest, cache: Cache | None = None, *, force: bool = False,
                 quiet: bool = False):
        self.request = request
        self.adapter = request.adapter
        self.cache = cache or Cache()
        self.force = force
        self.quiet = quiet

    @cached_property
    def loaded(self) -> LoadedModel:
        with step(f"load {self.request.name}", quiet=self.quiet) as s:
            model = self.adapter.load(self.request.weights, random_init=self.request.random_init,
                                      seed=self.request.seed)
            s.detail = model.weights.identity[:40]
        return model

    # -- stages --------------------------------------------------------------------------
    def _stage(self, stage: str, parts: dict, produce, label: str) -> Artifact:
        with step(label, quiet=self.quiet) as s:
            entry, status = self.cache.get_or_create(f"onnx-{stage}", parts, produce, force=self.force,
                                                     subject=self.request.subject)
            s.status = status if status != "forced" else "rebuilt"
        return Artifact(stage, entry, status)

    def export_parts(self, shape: Shape, opset: int) -> dict:
        framework = "ultralytics" if self.adapter.family == "yolo" else "transformers"
        return {
            "stage": "export",
            "model": self.adapter.variant,
            "weights": self.request.weights_identity,
            "shape": format_shape(shape),
            "opset": opset,
            "versions": {"enginekit": __version__, "torch": package_version("torch"),
                         framework: package_version(framework)},
        }

    def export(self, shape: Shape, opset: int) -> Artifact:
        from enginekit.onnx.export import export_onnx

        self.adapter.constraint.check(shape, what="--input")

        def produce(tmp: Path) -> dict:
            export_onnx(self.adapter, self.loaded, shape, tmp / ONNX_FILE, opset=opset)
            return {"weights": self.loaded.weights.identity}

        return self._stage("export", self.export_parts(shape, opset), produce, "export")

    def simplify(self, source: Artifact, shape: Shape, tool: str = "onnxsim") -> Artifact:
        from enginekit.onnx.simplify import simplify_onnx

        shapes = self.check_shapes(shape)
        parts = {"stage": "simplify", "input": source.sha256, "tool": tool, "tool_version": package_version(tool),
                 "checked": [format_shape(s) for s in shapes]}

        def produce(tmp: Path) -> dict:
            report = simplify_onnx(source.path, tmp / ONNX_FILE, tool=tool, check_shapes=shapes)
            return {"nodes_before": report.nodes_before, "nodes_after": report.nodes_after,
                    "max_rel_l2": report.max_rel_l2}

        return self._stage("simplify", parts, produce, f"simplify ({tool})")

    def fp16(self, source: Artifact, shape: Shape, images: ImageSet | None = None,
             keep_fp32_nodes: list[str] | None = None) -> Artifact:
        """AutoCast to FP16; its reference run sees real photographs at ``shape``."""
        from enginekit.onnx.precision import convert_fp16

        keep = sorted(set(self.adapter.fp16_keep_fp32) | set(keep_fp32_nodes or []))
        batch = image_batch(self.adapter, images or load_images(None, limit=2), shape, count=2)
        parts = {"stage": "fp16", "input": source.sha256, "modelopt": package_version("nvidia-modelopt"),
                 "keep_fp32": keep, "reference_data": array_digest(batch)}

        def produce(tmp: Path) -> dict:
            calib = tmp / "autocast_inputs.npz"
            np.savez(calib, **{self.adapter.input_name: batch})
            share = convert_fp16(source.path, tmp / ONNX_FILE, keep_fp32_nodes=keep, calibration=calib)
            calib.unlink()
            return {"initializer_dtype_share": share, "keep_fp32": keep}

        return self._stage("fp16", parts, produce, "fp16 (ModelOpt AutoCast)")

    def check_shapes(self, shape: Shape) -> list[Shape]:
        """Shapes a simplified graph is proven equal at: batch 1 and 2, and for dynamic H/W
        models a second, non-square size."""
        n, c, h, w = shape
        shapes = [(1, c, h, w), (2, c, h, w)]
        if 2 in self.adapter.dynamic_axes.get(self.adapter.input_name, {}):
            m = self.adapter.constraint.spatial_multiple
            shapes.append((1, c, h + m, max(m, w - m)))
        return shapes

    def onnx_chain(self, shape: Shape, *, opset: int, fp16: bool = False, simplifier: str = "onnxsim",
                   images: ImageSet | None = None) -> list[Artifact]:
        """export -> simplify (-> fp16): every artifact, last one the result."""
        chain = [self.export(shape, opset)]
        chain.append(self.simplify(chain[-1], shape, simplifier))
        if fp16:
            chain.append(self.fp16(chain[-1], shape, images))
        return chain


def image_batch(adapter: ModelAdapter, images: ImageSet, shape: Shape, count: int) -> np.ndarray:
    """Up to ``count`` photographs preprocessed as the reference does, stacked at ``shape``'s H/W."""
    hw = (shape[2], shape[3])
    arrays = [adapter.preprocess(img, hw) for img in images.images[:count]]
    return np.concatenate(arrays, axis=0).astype(np.float32)


def array_digest(array: np.ndarray) -> str:
    h = hashlib.sha256(str((array.shape, str(array.dtype))).encode())
    h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def copy_out(artifact: Artifact, dest: Path) -> Path:
    """Copy an artifact out of the cache atomically (temp file + rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        shutil.copyfile(artifact.path, tmp)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


__all__ = ["Artifact", "ModelRequest", "Pipeline", "WeightsSource", "copy_out", "key_for", "sha256_file"]
