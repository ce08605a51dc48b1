"""Reduced precision at the ONNX level, for strongly typed TensorRT builds.

TensorRT 11 has no FP16/INT8 builder flags: what runs in FP16 or INT8 is written into the
graph. FP16 comes from ModelOpt AutoCast (sensitive ops stay FP32, I/O stays FP32).
"""

from __future__ import annotations

import logging
from pathlib import Path

from enginekit.onnx.graph import get_metadata, initializer_dtype_share, load_model, save_model, set_metadata
from enginekit.stages.modelopt import autocast


def quiet_modelopt() -> None:
    """ModelOpt sets its loggers to INFO, printing to stdout, when its modules are imported."""
    import modelopt.onnx.autocast  # noqa: F401 - import first so its logger setup has run

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("modelopt"):
            logging.getLogger(name).setLevel(logging.ERROR)


def convert_fp16(src: Path, out: Path, *, keep_fp32_nodes: list[str] | None = None,
                 calibration: Path | None = None, shortcuts: bool = True) -> dict[str, float]:
    """AutoCast ``src`` to FP16 with FP32 I/O; returns the initializer dtype shares.

    ``calibration`` (.npz, one array per input) feeds AutoCast's reference run, which decides
    what stays FP32 from real value ranges; without it AutoCast invents inputs with every
    dynamic dim set to 1, which a dynamic-H/W model cannot run. ``shortcuts``: AutoCast's
    reference ranges measured in the graph instead of copied out (stages.modelopt.autocast);
    False runs ModelOpt's own way, for comparison. Both write the same graph.
    """
    from modelopt.onnx.autocast import convert_to_mixed_precision

    quiet_modelopt()

    original = load_model(src)
    with autocast(shortcuts):
        model = convert_to_mixed_precision(
            onnx_path=str(src),
            low_precision_type="fp16",
            keep_io_types=True,
            nodes_to_exclude=keep_fp32_nodes or None,
            calibration_data=str(calibration) if calibration else None,
        )
    # AutoCast's shape annotations make ONNX Runtime reject some graphs (YOLO): drop them,
    # every consumer re-infers shapes anyway.
    del model.graph.value_info[:]
    meta = get_metadata(original)
    meta["precision"] = "fp16"
    if keep_fp32_nodes:
        meta["fp32_nodes"] = ",".join(keep_fp32_nodes)
    set_metadata(model, meta)
    save_model(model, out)
    return initializer_dtype_share(model)
