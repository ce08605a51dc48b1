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
            try:
                onnx.checker.check_model(model)
            except Exception as exc:  # noqa: BLE001
                if "topologically sorted" not in str(exc):
                    raise
                # Ultralytics' CPU FP16 export (onnxruntime.transformers' float16 conversion) appends its input casts
                # after the nodes that read them: ONNX Runtime runs it, the checker and TensorRT want the nodes in
                # order. The same graph, sorted, is what the tools are given (``sorted_copy``)
                toposort(model.graph)
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


def is_toposorted(graph) -> bool:
    """Whether every node's inputs are made before it (graph inputs, initializers, earlier nodes' outputs)."""
    known = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    for node in graph.node:
        if any(i not in known for i in node.input):
            return False
        known.update(node.output)
    return True


def toposort(graph) -> None:
    """Put ``graph``'s nodes in an order where each comes after what it reads, otherwise in their order in the file
    (Kahn's algorithm, the earliest ready node first); names a subgraph reads from outside count as made. Nodes that
    can never run (a cycle, a missing input) are kept last, as they were."""
    import heapq

    nodes = list(graph.node)
    made = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    needs = [{producer[i] for i in n.input if i not in made and i in producer} for n in nodes]
    readers: dict[int, list[int]] = {}
    for k, deps in enumerate(needs):
        for d in deps:
            readers.setdefault(d, []).append(k)
    ready = [k for k, deps in enumerate(needs) if not deps]
    heapq.heapify(ready)
    order, waiting = [], [len(d) for d in needs]
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for r in readers.get(k, []):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    seen = set(order)
    order += [k for k in range(len(nodes)) if k not in seen]
    copies = [_copy(nodes[k]) for k in order]
    del graph.node[:]
    graph.node.extend(copies)


def _copy(node):
    import onnx

    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


def holds_fp16(graph) -> bool:
    """Whether a graph computes in FP16: FP16 weights, or casts to FP16."""
    import onnx

    fp16 = onnx.TensorProto.FLOAT16
    return any(i.data_type == fp16 for i in graph.initializer) or any(
        n.op_type == "Cast" and any(a.name == "to" and a.i == fp16 for a in n.attribute) for n in graph.node)


def upcast_fp16(model) -> None:
    """An FP16 graph (FP16 weights and casts to FP16: Ultralytics' ``half=True`` export) computing in FP32 again, in
    place: every FP16 weight and constant widened (exactly: FP32 holds each FP16 value), every cast to FP16 a cast to
    FP32, every FP16 tensor type FP32. The values stay the FP16 ones; calibrating it for INT8 starts from them."""
    import onnx
    from onnx import numpy_helper

    fp16, fp32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    graph = model.graph
    for k, init in enumerate(graph.initializer):
        if init.data_type == fp16:
            graph.initializer[k].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype("float32"),
                                                                  init.name))
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == fp16:
                attr.i = fp32
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == fp16:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype("float32"), attr.t.name))
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == fp16:
            value.type.tensor_type.elem_type = fp32
