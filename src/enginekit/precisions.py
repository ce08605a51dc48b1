"""The precisions an engine is built in: one registry, the only place their names are listed.

Each precision says which pipeline stage makes the graph an engine is built from, what goes into
the engine key, what it needs (calibration data, a GPU with FP8), and what can run its graphs.
Parity tolerances are the families' (measured per model); this module knows no model.

    fp32  export + simplify           any GPU     ONNX Runtime, PyTorch
    fp16  ModelOpt AutoCast           any GPU     ONNX Runtime, PyTorch
    int8  ModelOpt Q/DQ (calibrated)  any GPU     ONNX Runtime
    fp8   ModelOpt Q/DQ (max)         8.9 and up  TensorRT only
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from enginekit.errors import UsageError


@dataclass(frozen=True)
class Precision:
    name: str
    #: the pipeline stages whose graphs are in this precision; the first makes the graph an engine is built from
    stages: tuple[str, ...]
    #: how its graph is made, in the user's words
    made_by: str
    #: quantized with Q/DQ nodes (else a float graph)
    quantized: bool = False
    #: needs calibration data (images, an array, or a calibration cache)
    calibrated: bool = False
    #: the one calibration method it uses; None: chosen per build (--calib-method, the family's) or none
    method: Optional[str] = None
    #: the oldest compute capability whose GPUs run it; None: every GPU TensorRT runs on
    min_compute_capability: Optional[tuple[int, int]] = None
    #: ONNX Runtime runs its graphs (it refuses FP8 Q/DQ around data-movement ops)
    onnxruntime: bool = True
    #: PyTorch runs the model in it, and ``enginekit export`` writes its graph (no calibration)
    exported: bool = False
    #: ``--repair`` can keep its offending nodes in higher precision
    repairable: bool = False
    #: computes in fewer bits than the FP32 model, so detections near the operating point flip at some rate
    #: (its task gates are rates, judged on enough detections); FP32 graphs match PyTorch to ~1e-6, where
    #: one flip is a fault whatever the count
    reduced: bool = True

    @property
    def stage(self) -> str:
        """The stage whose graph an engine of this precision is built from."""
        return self.stages[0]

    def runs_on(self, compute_capability: str) -> bool:
        """Whether GPUs of ``compute_capability`` ("8.6") have the units this precision needs."""
        if self.min_compute_capability is None:
            return True
        major, _, minor = compute_capability.partition(".")
        return (int(major), int(minor or 0)) >= self.min_compute_capability

    def key(self, method: Optional[str] = None, exclude: Optional[list[str]] = None,
            calibration: Optional[str] = None, repaired_nodes: Optional[list[str]] = None) -> dict:
        """The engine key's precision part: the mode, and for a quantized graph how it was made."""
        out: dict = {"mode": self.name}
        if method is not None:
            out.update(method=method, exclude=exclude or [], calibration=calibration)
        if repaired_nodes is not None:
            out["repaired_nodes"] = repaired_nodes
        return out


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", ("simplify", "export"), "export + simplify", exported=True, reduced=False),
    Precision("fp16", ("fp16",), "ModelOpt AutoCast", exported=True, repairable=True),
    Precision("int8", ("int8", "int8-repair"), "ModelOpt Q/DQ", quantized=True, calibrated=True, repairable=True),
    Precision("fp8", ("fp8",), "ModelOpt Q/DQ, max calibration", quantized=True, calibrated=True, method="max",
              min_compute_capability=(8, 9), onnxruntime=False),
)}
NAMES: tuple[str, ...] = tuple(PRECISIONS)

#: the ONNX metadata key, and value, of a graph exported from a quantization-aware trained checkpoint (Ultralytics'
#: ``train(quantize=8)``): its Q/DQ nodes carry the trained INT8 ranges, so its INT8 is that graph (no calibration)
QUANTIZATION = "quantization"
QAT = "qat-int8"
#: how such a graph's INT8 was made (the engine key's method): every graph of its chain is INT8
QAT_METHOD = "qat"


def is_qat(metadata) -> bool:
    """Whether a graph's metadata says it holds the trained Q/DQ ranges of a quantization-aware checkpoint."""
    return bool(metadata) and metadata.get(QUANTIZATION) == QAT


def get(name: str) -> Precision:
    """The precision named ``name``, or a one-line UsageError listing them."""
    if name not in PRECISIONS:
        raise UsageError(f"unknown precision {name!r}: choose {', '.join(NAMES)}")
    return PRECISIONS[name]


def names(**where: bool) -> tuple[str, ...]:
    """The names of the precisions with the given traits: ``names(exported=True)`` -> fp32, fp16."""
    return tuple(p.name for p in PRECISIONS.values() if all(getattr(p, k) == v for k, v in where.items()))


def of_stage(stage: str) -> Optional[str]:
    """The precision of a pipeline stage's graph (``simplify`` -> fp32); None for a user's file."""
    for p in PRECISIONS.values():
        if stage in p.stages:
            return p.name
    return None

