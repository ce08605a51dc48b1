"""FP8 (E4M3) at the ONNX level: explicit Q/DQ nodes through ModelOpt, max calibration.

Only for targets that run FP8 (compute capability 8.9 and newer); the caller checks them.
ONNX Runtime's CPU provider cannot run the result (ModelOpt moves data-movement ops such as
Transpose between Q and DQ, which TensorRT accepts and ORT refuses), so its parity can only be
checked on an engine, on a GPU that has FP8.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from pathlib import Path

import numpy as np

from enginekit.onnx.graph import get_metadata, load_model, save_model, set_metadata
from enginekit.stages.fp16 import quiet_modelopt
from enginekit.stages.modelopt import calibration_eps


def quantize_fp8(src: Path, out: Path, calibration: np.ndarray, input_name: str, *,
                 exclude_nodes: list[str] | tuple[str, ...] = ()) -> int:
    """Write the FP8 Q/DQ graph of ``src`` to ``out``; returns the number of QuantizeLinear nodes."""
    import onnx
    from modelopt.onnx.quantization import quantize

    quiet_modelopt()
    original = load_model(src)
    with tempfile.TemporaryDirectory(prefix="enginekit-fp8-") as tmp:
        work, result = Path(tmp) / "model.onnx", Path(tmp) / "model.fp8.onnx"
        shutil.copyfile(src, work)  # ModelOpt writes intermediate files beside its input
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            quantize(
                str(work),
                quantize_mode="fp8",
                calibration_method="max",
                calibration_data={input_name: np.ascontiguousarray(calibration, dtype=np.float32)},
                calibration_eps=calibration_eps(),
                nodes_to_exclude=list(exclude_nodes) or None,
                high_precision_dtype="fp32",
                output_path=str(result),
                log_level="ERROR",
            )
        model = onnx.load(str(result))
    del model.graph.value_info[:]
    meta = get_metadata(original)
    meta.update({"precision": "fp8", "fp8_exclude": ",".join(exclude_nodes)})
    set_metadata(model, meta)
    save_model(model, out)
    return sum(n.op_type == "QuantizeLinear" for n in model.graph.node)
