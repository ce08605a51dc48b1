"""Small ONNX file helpers shared by the stages: load with clear errors, atomic save, I/O."""

from __future__ import annotations

from pathlib import Path

from enginekit.errors import UsageError, first_line
from enginekit.fsutil import atomic_path
from enginekit.fsutil import refuse_special_file

# ONNX Runtime 1.24 reads IR version <= 11; onnx may write newer by default.
MAX_IR_VERSION = 10


def load_model(path: Path, *, check: bool = True):
    """Load and check an ONNX file; a missing or corrupt file is a one-line UsageError.

    ``check=False``: no ``onnx.checker`` pass (a graph enginekit's own export wrote, which ONNX Runtime
    loads next anyway: on deeplabv3_resnet50 the checker costs 0.65 s CPU, as long as the load)."""
    import onnx

    if not path.exists():
        raise UsageError(f"ONNX file not found: {path}")
    refuse_special_file(path, "ONNX file")
    if path.is_dir():
        raise UsageError(f"ONNX file {path} is a folder")
    try:
        model = onnx.load(str(path))
        if check:
            onnx.checker.check_model(model)
    except Exception as exc:  # noqa: BLE001 - protobuf and checker errors are long
        raise UsageError(f"{path} is not a valid ONNX model: {first_line(exc, 200)}") from exc
    known = onnx.defs.onnx_opset_version()
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > known:  # the checker lets it through
            raise UsageError(f"{path} asks for ONNX opset {opset.version}; onnx {onnx.__version__} and the tools "
                             f"built on it know opsets up to {known}")
    return model


def save_model(model, path: Path) -> Path:
    """Write to a temp file beside ``path`` and rename: no half-written ONNX is ever seen."""
    import onnx

    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))
    return path


def input_dims(model) -> dict[str, list[int | str]]:
    """Graph inputs (initializers excluded) -> dims, symbolic ones as their names."""
    inits = {i.name for i in model.graph.initializer}
    out: dict[str, list[int | str]] = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        dims: list[int | str] = []
        for d in value.type.tensor_type.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?"))
        out[value.name] = dims
    return out


def output_names(model) -> list[str]:
    return [o.name for o in model.graph.output]


def set_metadata(model, props: dict[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for key, value in sorted(props.items()):
        if key in existing:
            existing[key].value = str(value)
        else:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, str(value)


def get_metadata(model) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def initializer_dtype_share(model) -> dict[str, float]:
    """Share of initializer elements per data type, e.g. {"FLOAT16": 0.97, "FLOAT": 0.03}."""
    import numpy as np
    import onnx

    counts: dict[str, int] = {}
    for init in model.graph.initializer:
        n = int(np.prod(init.dims)) if init.dims else 1
        name = onnx.TensorProto.DataType.Name(init.data_type)
        counts[name] = counts.get(name, 0) + n
    total = sum(counts.values()) or 1
    return {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
