"""The Q/DQ layout of an INT8 graph, kept so that new activation scales need no ModelOpt pass.

ModelOpt's INT8 graph is the FP32 graph plus QuantizeLinear/DequantizeLinear pairs: on weights
(per-channel scales computed from the weights themselves: ``AddQDQPairToWeight``, no bias
quantization) and on activations (one scale per tensor, from calibration). Where it goes, and
the weight scales, depend on the graph and the INT8 settings, not on the activation ranges:
ranges decide only the activation scales' values. So once ModelOpt has quantized a graph, its
output minus those values (the *layout*) rebuilds, from the same FP32 graph and any calibration
cache for it, the very graph ModelOpt writes from that cache, without importing ModelOpt
(tests/test_int8.py compares them byte for byte, with the calibrating run's scales and with
others).

A layout is kept as an ONNX file holding ModelOpt's graph where every initializer equal to the
FP32 graph's is an empty placeholder of the same name, and a description (``LayoutInfo``): those
names, which initializer holds which activation tensor's scale, and the tensors a calibration
cache must give. ``describe`` refuses (None) any graph that does not have that structure, so a
layout is only ever written where rebuilding gives ModelOpt's graph.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LAYOUT_FORMAT = 1  # part of the layout's cache key: bump when what is kept or how it is applied changes
LAYOUT_FILE = "layout.onnx"
_FLOAT = 1  # onnx.TensorProto.FLOAT
_QDQ = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class LayoutInfo:
    """What a layout file holds besides the graph: JSON data (a cache manifest's fields)."""

    from_source: list[str]  # initializers taken from the FP32 graph, by name
    activation_scales: dict[str, str]  # scale initializer -> the activation tensor whose scale it holds
    calibrated: list[str]  # the tensors a calibration cache must give (what ModelOpt's calibrator measures)

    def to_json(self) -> dict:
        return {"layout_format": LAYOUT_FORMAT, "from_source": self.from_source,
                "activation_scales": self.activation_scales, "calibrated": self.calibrated}

    @classmethod
    def from_json(cls, data: dict) -> "LayoutInfo | None":
        if data.get("layout_format") != LAYOUT_FORMAT:
            return None
        return cls(list(data["from_source"]), dict(data["activation_scales"]), list(data["calibrated"]))


def _scalar_float(tensor) -> float | None:
    """The value of a 0-d float32 initializer, whichever field holds it; None for anything else."""
    if tensor.data_type != _FLOAT or len(tensor.dims) != 0 or tensor.data_location != 0:
        return None
    if tensor.raw_data:
        return struct.unpack("<f", tensor.raw_data)[0] if len(tensor.raw_data) == 4 else None
    return tensor.float_data[0] if len(tensor.float_data) == 1 else None


def _set_scalar_float(tensor, value: float) -> None:
    """Write ``value`` into a 0-d float32 initializer in the field it already uses (same bytes as ORT's)."""
    if tensor.raw_data:
        tensor.raw_data = struct.pack("<f", value)
    else:
        tensor.float_data[0] = value


def describe(quantized, source, scales: dict[str, float], scale_of: Callable[[float], float]):
    """(layout model, LayoutInfo) of ModelOpt's ``quantized`` graph of ``source``, made from ``scales``
    (tensor -> cache scale; ``scale_of`` gives what the graph holds for a cache scale). None when the
    graph is not FP32 initializers + Q/DQ whose activation scales are exactly ``scale_of(scales[t])``.
    """
    import onnx

    source_init = {t.name: t for t in source.graph.initializer}
    init = {t.name: t for t in quantized.graph.initializer}
    if len(init) != len(quantized.graph.initializer):
        return None  # duplicate initializer names: nothing to rebuild by name
    activation: dict[str, str] = {}
    for node in quantized.graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 2:
            continue
        tensor, scale = node.input[0], node.input[1]
        if tensor in init:
            continue  # a weight: its scales come from the weight, kept in the layout
        if scale not in init or tensor not in scales or activation.get(scale, tensor) != tensor:
            return None
        held = _scalar_float(init[scale])
        if held is None or struct.pack("<f", held) != struct.pack("<f", scale_of(scales[tensor])):
            return None
        activation[scale] = tensor
    if not activation:
        return None
    # An activation scale must be read only as the scale of its own tensor's Q/DQ pair.
    for node in quantized.graph.node:
        for slot, name in enumerate(node.input):
            if name in activation and not (node.op_type in _QDQ and slot == 1 and (
                    node.op_type == "DequantizeLinear" or node.input[0] == activation[name])):
                return None
    layout = onnx.ModelProto()
    layout.CopyFrom(quantized)
    del layout.graph.value_info[:]  # dropped from every INT8 graph anyway (int8._finish)
    del layout.metadata_props[:]
    from_source = []
    for tensor in layout.graph.initializer:
        original = source_init.get(tensor.name)
        if original is not None and tensor.name not in activation and original == tensor:
            from_source.append(tensor.name)
            tensor.Clear()
            tensor.name = original.name
    return layout, LayoutInfo(from_source, activation, sorted(scales))


def apply(layout, info: LayoutInfo, source, scales: dict[str, float], scale_of: Callable[[float], float]):
    """The INT8 graph from a layout: FP32 initializers back from ``source``, activation scales from ``scales``.

    ``layout`` is modified and returned. KeyError names a tensor ``scales`` lacks (the caller checks
    ``info.calibrated`` first); ValueError when ``source`` lacks an initializer the layout takes from it.
    """
    source_init = {t.name: t for t in source.graph.initializer}
    wanted = set(info.from_source)
    for tensor in layout.graph.initializer:
        if tensor.name in wanted:
            original = source_init.get(tensor.name)
            if original is None:
                raise ValueError(f"the FP32 graph has no initializer {tensor.name!r}")
            tensor.CopyFrom(original)
        elif tensor.name in info.activation_scales:
            _set_scalar_float(tensor, scale_of(scales[info.activation_scales[tensor.name]]))
    return layout


def save(layout, path: Path) -> None:
    import onnx

    onnx.save(layout, str(path))


def load(path: Path):
    import onnx

    return onnx.load(str(path))
