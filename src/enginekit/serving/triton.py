"""A Triton model repository for one model: the network and the family's own pre- and postprocessing.

Two models per enginekit model ``NAME``:

- ``NAME-net``: the network as the server runs it (``tensorrt_plan``, ``onnxruntime_onnx``, or ``python``: the
  graph on enginekit's runtime inside Triton's Python backend, for servers built without those backends);
  ``max_batch_size`` and the dims come from the graph (and the engine's profile), ``dynamic_batching`` from
  what the user or a tuned recipe says.
- ``NAME``: a Python-backend model that takes an image (raw uint8 HxWx3 BGR as OpenCV reads it, or the
  bytes of an encoded file), runs the family's preprocessing (the letterbox ``predict`` runs), calls
  ``NAME-net`` (one call for every image of a batch the server formed), and answers what ``enginekit
  predict`` answers: RESULT (the JSON record ``predict --json`` writes for the frame) and tensors by task.

Config texts are Triton's ``ModelConfig`` protobuf in text format; ``parse_config`` reads one back with
tritonclient's generated ``model_config_pb2`` (where tritonclient is installed) to check what was written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginekit.requests import TRITON_PLATFORMS as PLATFORMS  # noqa: F401 - the platforms, named once
from enginekit.images import embedded_image_paths
#: what each platform is called in config.pbtxt (``python`` is a backend, not a platform)
_PLATFORM_FIELD = {"onnxruntime": 'platform: "onnxruntime_onnx"', "tensorrt": 'platform: "tensorrt_plan"',
                   "python": 'backend: "python"'}
#: the network's file in its version folder, per platform
NET_FILE = {"onnxruntime": "model.onnx", "tensorrt": "model.plan", "python": "model.onnx"}
#: the marker in each model folder deploy writes (and may replace on the next deploy)
RECORD = "enginekit.json"

_NP_TO_TRITON = {np.dtype(np.float32): "TYPE_FP32", np.dtype(np.float16): "TYPE_FP16",
                 np.dtype(np.float64): "TYPE_FP64", np.dtype(np.int64): "TYPE_INT64",
                 np.dtype(np.int32): "TYPE_INT32", np.dtype(np.int8): "TYPE_INT8", np.dtype(np.uint8): "TYPE_UINT8",
                 np.dtype(np.bool_): "TYPE_BOOL"}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, Triton data type and dims (-1 where dynamic), batch dim included."""

    name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Outputs:
    """The front model's outputs for one kind of result: (name, Triton type, dims without the batch)."""

    tensors: tuple[tuple[str, str, tuple[int, ...]], ...]


_BOXES = (("BOXES", "TYPE_FP32", (-1, 4)), ("SCORES", "TYPE_FP32", (-1,)), ("CLASSES", "TYPE_INT32", (-1,)))
#: what the front model answers per result kind (``enginekit.results``), besides RESULT (the JSON record, with
#: the class names). Every tensor is numeric: text travels as UTF-8 in uint8 (RESULT, and ENCODED in), since
#: the Python backend's BYTES tensors go through the stub's build of NumPy, which NumPy 2 no longer matches.
OUTPUTS: dict[str, tuple] = {
    "detections": _BOXES,
    "segments": _BOXES + (("MASKS", "TYPE_UINT8", (-1, -1, -1)),),
    "poses": _BOXES + (("KEYPOINTS", "TYPE_FP32", (-1, -1, -1)),),
    "oriented_boxes": (("BOXES", "TYPE_FP32", (-1, 5)),) + _BOXES[1:],
    "classification": (("CLASSES", "TYPE_INT32", (-1,)), ("SCORES", "TYPE_FP32", (-1,)),
                       ("PROBABILITIES", "TYPE_FP32", (-1,))),
    "depth": (("DEPTH", "TYPE_FP32", (-1, -1)),),
    "semantic": (("CLASS_MAP", "TYPE_INT32", (-1, -1)),),
}
RESULT = ("RESULT", "TYPE_UINT8", (-1,))
IMAGE, ENCODED = "IMAGE", "ENCODED"


def result_tensors(result) -> dict[str, np.ndarray]:
    """One result (``enginekit.results``) as the front model's output tensors, without the batch dim."""
    kind = result.kind
    record = {"found": result.found(), **result.to_json()}  # the record ``predict --json`` writes for a frame
    out = {"RESULT": np.frombuffer(json.dumps(record).encode(), np.uint8).copy()}
    getters = {
        "BOXES": lambda: np.asarray(result.boxes, np.float32).reshape(-1, 5 if kind == "oriented_boxes" else 4),
        "SCORES": lambda: np.asarray(result.scores, np.float32).reshape(-1),
        "CLASSES": lambda: np.asarray(result.class_ids, np.int32).reshape(-1),
        "MASKS": lambda: np.asarray(result.masks, np.uint8),
        "KEYPOINTS": lambda: np.asarray(result.keypoints, np.float32),
        "PROBABILITIES": lambda: np.asarray(result.probabilities, np.float32).reshape(-1),
        "DEPTH": lambda: np.asarray(result.depth, np.float32),
        "CLASS_MAP": lambda: np.asarray(result.class_map, np.int32),
    }
    for name, _, _ in OUTPUTS.get(kind, ()):
        out[name] = getters[name]()
    return out


def result_kind(predictor) -> str:
    """The ``kind`` of the results ``predictor`` returns (``enginekit.results``), from one embedded photograph."""
    return predictor(next(iter(embedded_image_paths()))).kind


# -- the network's I/O -------------------------------------------------------------------------------
def graph_io(onnx_path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The graph's inputs and outputs (initializers left out): names, Triton types, dims (-1 where symbolic)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(onnx_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def spec(v) -> TensorSpec:
        t = v.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim)
        return TensorSpec(v.name, _NP_TO_TRITON.get(dtype, "TYPE_FP32"), dims)

    return ([spec(v) for v in model.graph.input if v.name not in inits], [spec(v) for v in model.graph.output])


def with_profile(inputs: list[TensorSpec], profiles: list[dict]) -> list[TensorSpec]:
    """Inputs with the dims an engine's profiles fix (min == max over every profile) filled in."""
    out = []
    for spec in inputs:
        ranges = [p[spec.name] for p in profiles if spec.name in p]
        dims = list(spec.dims)
        for i in range(len(dims)):
            values = {tuple(r[k])[i] for r in ranges for k in ("min", "max") if len(r[k]) > i}
            if len(values) == 1 and dims[i] == -1:
                dims[i] = values.pop()
        out.append(TensorSpec(spec.name, spec.data_type, tuple(dims)))
    return out


def profile_max_batch(profiles: list[dict], input_name: str) -> int | None:
    """The largest batch an engine's profiles take for ``input_name``."""
    batches = [int(p[input_name]["max"][0]) for p in profiles if input_name in p]
    return max(batches) if batches else None


# -- config.pbtxt ------------------------------------------------------------------------------------
@dataclass
class Serving:
    """How the server schedules a model: ``max_batch`` (0: the graph takes no batch dim of its own),
    ``preferred`` batch sizes, the queue delay, instances and where they run (KIND_AUTO, KIND_GPU or KIND_CPU)."""

    max_batch: int = 8
    preferred: list[int] = field(default_factory=list)
    queue_delay_us: int = 2000
    instances: int = 1
    kind: str = "KIND_GPU"


def _dims(dims) -> str:
    return "[ " + ", ".join(str(int(d)) for d in dims) + " ]"


def _tensor_block(word: str, specs, extra=lambda s: "") -> str:
    items = ",\n".join(f'  {{\n    name: "{s.name}"\n    data_type: {s.data_type}\n    dims: {_dims(s.dims)}{extra(s)}\n  }}'
                       for s in specs)
    return f"{word} [\n{items}\n]\n"


def _scheduling(serving: Serving, name_env: str | None) -> str:
    text = ""
    if serving.max_batch > 0:
        preferred = [b for b in serving.preferred if b <= serving.max_batch]
        text += "dynamic_batching {\n"
        if preferred:
            text += f"  preferred_batch_size: {_dims(preferred)}\n"
        text += f"  max_queue_delay_microseconds: {int(serving.queue_delay_us)}\n}}\n"
    text += f"instance_group [\n  {{\n    count: {int(serving.instances)}\n    kind: {serving.kind}\n  }}\n]\n"
    if name_env:
        text += ('parameters: {\n  key: "EXECUTION_ENV_PATH"\n'
                 f'  value: {{ string_value: {json.dumps(name_env)} }}\n}}\n')
    return text


def net_config(name: str, platform: str, inputs: list[TensorSpec], outputs: list[TensorSpec], serving: Serving,
               python_env: str | None = None) -> str:
    """``NAME-net``'s config.pbtxt. Dims are given without the batch dim where ``serving.max_batch`` > 0 (the
    graph's first dim is then its batch)."""
    batched = serving.max_batch > 0
    strip = (lambda s: TensorSpec(s.name, s.data_type, s.dims[1:])) if batched else (lambda s: s)
    text = f'name: "{name}"\n{_PLATFORM_FIELD[platform]}\nmax_batch_size: {serving.max_batch if batched else 0}\n'
    text += _tensor_block("input", [strip(s) for s in inputs])
    text += _tensor_block("output", [strip(s) for s in outputs])
    return text + _scheduling(serving, python_env if platform == "python" else None)


def front_config(name: str, kind: str, serving: Serving, python_env: str | None) -> str:
    """``NAME``'s config.pbtxt: a Python-backend model taking IMAGE (uint8 HxWx3, BGR) or ENCODED (a file's
    bytes as uint8), one image per request (a batch of 1); the server gathers requests into batches of up to
    ``serving.max_batch`` (at least 1), which the model preprocesses and sends to the network together."""
    batch = max(1, serving.max_batch)
    text = f'name: "{name}"\nbackend: "python"\nmax_batch_size: {batch}\n'
    inputs = [TensorSpec(IMAGE, "TYPE_UINT8", (-1, -1, 3)), TensorSpec(ENCODED, "TYPE_UINT8", (-1,))]
    text += _tensor_block("input", inputs, lambda s: "\n    optional: true\n    allow_ragged_batch: true")
    text += _tensor_block("output", [TensorSpec(n, t, d) for n, t, d in (RESULT, *OUTPUTS.get(kind, ()))])
    return text + _scheduling(Serving(batch, serving.preferred, serving.queue_delay_us, serving.instances,
                                      "KIND_CPU"), python_env)


def parse_config(text: str):
    """``text`` read as Triton's ``ModelConfig`` (tritonclient's generated protobuf, loaded from its file so
    that tritonclient's gRPC client need not be installed); ValueError naming what Triton would refuse to read."""
    import importlib.util

    import tritonclient
    from google.protobuf import text_format

    path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location("enginekit_triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        return text_format.Parse(text, module.ModelConfig())
    except text_format.ParseError as exc:
        raise ValueError(f"not a Triton model config: {exc}") from exc


# -- the Python models' files -------------------------------------------------------------------------
MODEL_PY = '''"""Written by `enginekit deploy triton` ({what}); the code is enginekit's: {where}."""
from enginekit.serving.triton_models import {cls} as TritonPythonModel  # noqa: F401
'''


def model_py(cls: str, what: str) -> str:
    return MODEL_PY.format(what=what, where=f"enginekit.serving.triton_models.{cls}", cls=cls)
