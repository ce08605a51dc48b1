"""INT8 (and FP8) quantization, the same steps in less time: ``quantize_shortcuts()`` swaps in faster versions of the helpers of ModelOpt's INT8 pass that scan the whole graph per call, of its per-channel weight scales and of the inference runs read for their shapes alone; what they return is what the originals return.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from enginekit.stages.modelopt.fp16 import shortcuts_allowed
from enginekit.stages.modelopt.versions import missing_internal, problem, swapped


QUANTIZE_INTERNALS = (
    ("onnx.checker", "check_model"),
    ("onnxruntime.quantization.onnx_model", "ONNXModel"),
    ("onnxruntime.quantization.qdq_quantizer", "compute_data_quant_params"),
    ("onnxruntime.quantization.qdq_quantizer", "find_by_name"),
    ("onnxruntime.quantization.base_quantizer", "find_by_name"),
    ("onnxruntime.quantization.onnx_model", "find_by_name"),
    ("onnxruntime.quantization.quant_utils", "get_qmin_qmax_for_qType"),
    ("modelopt.onnx.quantization.graph_utils", "get_extended_model_outputs"),
    ("modelopt.onnx.quantization.ort_utils", "_prepare_ep_list"),
)


@dataclass
class QuantizeRun:
    """What ``quantize_shortcuts()`` did."""

    shortcuts: bool
    shape_runs: int = 0  # inference runs made to learn tensor shapes (ModelOpt's way: one per call)


@functools.lru_cache(maxsize=1)
def _quantize_problem() -> str | None:
    reason = problem()
    if reason is not None:
        return reason
    missing = missing_internal(QUANTIZE_INTERNALS)
    if missing is not None:
        return missing
    from onnxruntime.quantization.onnx_model import ONNXModel

    if not callable(getattr(ONNXModel, "replace_input_of_all_nodes", None)):
        return "ONNXModel.replace_input_of_all_nodes is missing"
    return None


@contextlib.contextmanager
def quantize_shortcuts(enabled: bool = True, output: Path | None = None) -> Iterator[QuantizeRun]:
    """ModelOpt's INT8/FP8 pass with the faster, same-result helpers below swapped in (if ``enabled``
    and the installed versions are the ones they were written for).

    ``output``: the ``output_path`` given to ModelOpt's ``quantize``. Its last step reloads that file
    to run ``onnx.checker`` on it, whose only effect is a warning in ModelOpt's log (which enginekit
    silences; the graph is checked where it is next loaded): that one check is left out.
    """
    run = QuantizeRun(shortcuts=bool(enabled) and shortcuts_allowed() and _quantize_problem() is None)
    if not run.shortcuts:
        yield run
        return
    import onnx.checker
    from modelopt.onnx.quantization import graph_utils
    from onnxruntime.quantization import base_quantizer, onnx_model, qdq_quantizer
    from onnxruntime.quantization.onnx_model import ONNXModel

    patches = [
        (ONNXModel, "replace_input_of_all_nodes", _replace_input_of_all_nodes),
        (qdq_quantizer, "find_by_name", _find_by_name),
        (base_quantizer, "find_by_name", _find_by_name),
        (onnx_model, "find_by_name", _find_by_name),
        (qdq_quantizer, "compute_data_quant_params",
         _symmetric_int8_params(vars(qdq_quantizer)["compute_data_quant_params"])),
        (graph_utils, "get_extended_model_outputs",
         _shapes_only_outputs(vars(graph_utils)["get_extended_model_outputs"], run)),
    ]
    if output is not None:
        patches.append((onnx.checker, "check_model", _unchecked(vars(onnx.checker)["check_model"], Path(output))))
    with swapped(patches, _QUANTIZE_LOCK):
        yield run


_QUANTIZE_LOCK = threading.RLock()  # the helper swaps are process-wide: one quantization at a time


def _unchecked(original: Callable, output: Path) -> Callable:
    """``onnx.checker.check_model``, except on ``output`` (the file ModelOpt checks only to log)."""
    target = os.path.abspath(output)

    def check_model(model, *args, **kwargs):
        if isinstance(model, (str, os.PathLike)) and os.path.abspath(model) == target:
            return None
        return original(model, *args, **kwargs)

    return check_model


def _replace_input_of_all_nodes(self, old_input_name: str, new_input_name: str) -> None:
    """``ONNXModel.replace_input_of_all_nodes``: the node's inputs tested in C before Python loops on them."""
    from onnxruntime.quantization.onnx_model import ONNXModel

    for node in self.model.graph.node:
        if old_input_name in node.input:
            ONNXModel.replace_node_input(node, old_input_name, new_input_name)


def _find_by_name(item_name, item_list):
    """``quant_utils.find_by_name``: the first item so named, or None (stops at it)."""
    for item in item_list:
        if item.name == item_name:
            return item
    return None


def _symmetric_int8_params(original: Callable) -> Callable:
    """``compute_data_quant_params`` for symmetric INT8 (per-channel weights) in scalar arithmetic.

    The original rounds the same numbers through numpy 0-d arrays: min and max of the data (float32),
    widened to include 0, absmax = max(|min|, |max|), scale = float64(2 * absmax) / 254 rounded to
    float32 (1.0 below float32's tiny), zero point round((qmin + qmax) / 2) = 0. Python floats are
    IEEE doubles, so each step gives the same bits. Anything else (other types, overrides, NaN or
    infinite data, empty data) goes to the original.
    """
    import onnx

    int8 = onnx.TensorProto.INT8
    tiny = float(np.finfo(np.float32).tiny)

    def compute_data_quant_params(data, quant_type, symmetric, reduce_range=False, min_real_range=None,
                                  rmin_override=None, rmax_override=None):
        if (quant_type != int8 or not symmetric or reduce_range or min_real_range is not None
                or rmin_override is not None or rmax_override is not None
                or not isinstance(data, np.ndarray) or data.dtype != np.float32 or data.ndim != 1 or not len(data)):
            return original(data, quant_type, symmetric, reduce_range=reduce_range, min_real_range=min_real_range,
                            rmin_override=rmin_override, rmax_override=rmax_override)
        low, high = float(data.min()), float(data.max())
        if not (np.isfinite(low) and np.isfinite(high)):
            return original(data, quant_type, symmetric)
        from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

        qmin, qmax = get_qmin_qmax_for_qType(quant_type, reduce_range, symmetric=symmetric)
        absmax = max(abs(min(low, 0.0)), abs(max(high, 0.0)))
        scale = (absmax - -absmax) / (float(qmax) - float(qmin))
        if scale < tiny:
            return np.array(0, dtype=qmin.dtype), np.array(1.0, dtype=np.float32)
        zero_point = np.array(np.round((qmin + qmax) / np.array(2.0, dtype=np.float64)), dtype=qmin.dtype)
        return zero_point, np.array(scale).astype(np.float32)

    return compute_data_quant_params


def _shapes_only_outputs(original: Callable, record: QuantizeRun) -> Callable:
    """ModelOpt's ``get_extended_model_outputs``, for callers that read only the outputs' shapes.

    ModelOpt 0.47 calls it twice per INT8/FP8 pass (attention sizes, then MatMul sizes), each time
    running the whole graph with the tensors it asks about as outputs, and reads ``.shape`` of
    each. Here one run measures the shape of every tensor at the first calibration input (a
    ``Shape`` node per tensor, nothing else added) and both calls are answered from it with
    zero-cost arrays of those shapes.
    """
    memo: dict[tuple, dict[str, tuple[int, ...]]] = {}

    def get_extended_model_outputs(onnx_path, extended_model, use_external_data_format,
                                   intermediate_generated_files, calibration_data_reader, calibration_eps,
                                   input_shapes_profile=None, trt_rtx_backend="legacy"):
        def fallback():
            return original(onnx_path, extended_model, use_external_data_format, intermediate_generated_files,
                            calibration_data_reader, calibration_eps, input_shapes_profile, trt_rtx_backend)

        if use_external_data_format or input_shapes_profile is not None or "trt" in calibration_eps:
            return fallback()
        inputs = calibration_data_reader.get_first()
        names = [o.name for o in extended_model.graph.output]
        try:
            stat = Path(onnx_path).stat()
            key = (str(onnx_path), stat.st_mtime_ns, stat.st_size, len(extended_model.graph.node),
                   tuple((k, tuple(np.shape(v)), str(np.asarray(v).dtype)) for k, v in sorted(inputs.items())))
            shapes = memo.get(key)
            if shapes is None or any(n not in shapes for n in names):
                shapes = _tensor_shapes(extended_model, inputs, calibration_eps)
                memo[key] = shapes
                record.shape_runs += 1
            return {n: np.broadcast_to(np.zeros((), np.float32), shapes[n]) for n in names}
        except Exception:  # noqa: BLE001 - ModelOpt's own run decides
            return fallback()

    return get_extended_model_outputs


def _tensor_shapes(model, inputs: dict, calibration_eps) -> dict[str, tuple[int, ...]]:
    """Shape of every main-graph tensor (and initializer, and input) of ``model`` run on ``inputs``."""
    import copy

    import onnx
    import onnxruntime as ort
    from modelopt.onnx.quantization.ort_utils import _prepare_ep_list

    probe = copy.deepcopy(model)
    taken = {n for node in probe.graph.node for n in (*node.input, *node.output)}
    shape_of: dict[str, str] = {}
    nodes = []
    for node in probe.graph.node:
        nodes.append(node)
        for name in node.output:
            if not name or name in shape_of:
                continue
            shape_name = f"{name}::shape"
            while shape_name in taken:
                shape_name += "_"
            shape_of[name] = shape_name
            nodes.append(onnx.helper.make_node("Shape", [name], [shape_name], name=shape_name))
    del probe.graph.node[:]
    probe.graph.node.extend(nodes)
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in shape_of.values())
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as create_inference_session
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED  # each Shape right after its tensor, see above
    session = ort.InferenceSession(probe.SerializeToString(), opts, providers=_prepare_ep_list(list(calibration_eps)))
    values = session.run(list(shape_of.values()), dict(inputs))
    shapes = {name: tuple(int(d) for d in value) for name, value in zip(shape_of, values)}
    shapes.update((i.name, tuple(i.dims)) for i in model.graph.initializer)
    shapes.update((k, tuple(np.shape(v))) for k, v in inputs.items())
    return shapes
