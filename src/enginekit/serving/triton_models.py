"""The Python-backend models ``enginekit deploy triton`` writes (their model.py imports these classes).

They run inside Triton's Python backend stub, where ``triton_python_backend_utils`` is importable; it is
imported when the server calls ``initialize``. A request that cannot be served (an empty image, bytes that
are no image, neither input or both) gets an error response of its own; the others in the same batch are
answered, and the model keeps serving.

- ``NetModel``: the network (``NAME-net`` on ``--platform python``): enginekit's ONNX Runtime session on the
  graph in the version folder; requests of one shape are run as one batch.
- ``PipelineModel``: ``NAME``: images -> the family's preprocessing -> ``NAME-net`` (through the server, one
  call per network batch) -> the family's postprocessing -> RESULT and the task's tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from enginekit.serving.triton import ENCODED, IMAGE, RECORD, result_tensors
from enginekit import backends
from enginekit.backends.base import ONNX
from enginekit.runtime.loader import load, predictor_from_record


def _utils():
    import triton_python_backend_utils as pb

    return pb


def _array(tensor) -> np.ndarray:
    """A Triton tensor as numpy, through DLPack (the stub's own numpy conversion assumes NumPy 1's layout)."""
    return np.from_dlpack(tensor)


def _tensor(name: str, value: np.ndarray):
    """numpy -> a Triton tensor, through DLPack (see ``_array``). A fresh C-order copy: the server checks every
    stride, also those numpy leaves free (a dimension of 1 or 0 elements)."""
    value = np.asarray(value)
    if value.size == 0:  # numpy gives an empty array strides of 0; the server wants C order's
        strides = [value.itemsize * int(np.prod(value.shape[i + 1:])) for i in range(value.ndim)]
        fresh = np.lib.stride_tricks.as_strided(np.empty(1, value.dtype), value.shape, strides)
    else:
        fresh = np.empty(value.shape, value.dtype)
        fresh[...] = value
    return _utils().Tensor.from_dlpack(name, fresh)


def _folder(args: dict) -> Path:
    return Path(args["model_repository"]) / str(args["model_version"])


class NetModel:
    """The graph on ONNX Runtime (CPU) through enginekit's runtime, inside the server."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.input_name = config["input"][0]["name"]
        self.output_names = [o["name"] for o in config["output"]]
        self.session = load(_folder(args) / "model.onnx", backend=backends.verifier(ONNX).name).session

    def execute(self, requests):
        pb = _utils()
        arrays = [_array(pb.get_input_tensor_by_name(r, self.input_name)) for r in requests]
        responses: list = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, a in enumerate(arrays):
            groups.setdefault((a.shape[1:], a.dtype.str), []).append(i)
        for members in groups.values():
            try:
                batch = np.concatenate([arrays[i] for i in members]) if self.batched else arrays[members[0]]
                outputs = self.session(batch)
            except Exception as exc:  # one bad batch is answered with its error; the model keeps serving
                for i in members:
                    responses[i] = pb.InferenceResponse(error=pb.TritonError(f"{type(exc).__name__}: {exc}"))
                continue
            start = 0
            for i in members:
                n = arrays[i].shape[0] if self.batched else 1
                tensors = [_tensor(name, outputs[name][start:start + n] if self.batched else outputs[name])
                           for name in self.output_names]
                responses[i] = pb.InferenceResponse(output_tensors=tensors)
                start += n
        return responses


class TritonNet:
    """A session (``backends.base``'s shape: ``info`` and ``__call__``) whose network is another model of the
    same server, called through Triton (business logic scripting)."""

    def __init__(self, info, model: str):
        self.info = info
        self.model = model

    def activate(self) -> None:
        pass

    def __call__(self, x: np.ndarray) -> dict:
        pb = _utils()
        dtype = np.dtype(self.info.input_dtype or np.float32)
        request = pb.InferenceRequest(model_name=self.model, requested_output_names=list(self.info.output_names),
                                      inputs=[_tensor(self.info.input_name, np.asarray(x, dtype=dtype))])
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{self.model}: {response.error().message()}")
        return {name: _array(pb.get_output_tensor_by_name(response, name)) for name in self.info.output_names}


class PipelineModel:
    """Images in, what ``enginekit predict`` finds out (RESULT and the task's tensors)."""

    def initialize(self, args: dict) -> None:
        record = json.loads((_folder(args) / RECORD).read_text())
        self.predictor = predictor_from_record(record, lambda info: TritonNet(info, record["net"]))

    def _frame(self, request) -> np.ndarray:
        import cv2

        pb = _utils()
        image = pb.get_input_tensor_by_name(request, IMAGE)
        encoded = pb.get_input_tensor_by_name(request, ENCODED)
        if (image is None) == (encoded is None):
            raise ValueError(f"send one input: {IMAGE} (uint8 HxWx3, BGR) or {ENCODED} (an image file's bytes, uint8)")
        if image is not None:
            frame = _array(image)
            if frame.ndim == 4:  # the request's batch dim: one image per request
                if frame.shape[0] != 1:
                    raise ValueError(f"one image per request: got a batch of {frame.shape[0]}")
                frame = frame[0]
            if frame.ndim != 3 or frame.shape[-1] != 3 or 0 in frame.shape:
                raise ValueError(f"{IMAGE}: expected an HxWx3 image, got shape {tuple(frame.shape)}")
            return np.ascontiguousarray(frame)
        data = _array(encoded)
        if data.ndim == 2:  # the request's batch dim: one file per request
            if data.shape[0] != 1:
                raise ValueError(f"one image per request: got a batch of {data.shape[0]}")
            data = data[0]
        data = np.ascontiguousarray(data.reshape(-1))
        frame = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
        if frame is None:
            raise ValueError(f"{ENCODED}: {data.size} bytes that OpenCV does not read as an image")
        return frame

    def execute(self, requests):
        pb = _utils()
        responses: list = [None] * len(requests)
        frames, owners = [], []
        for i, request in enumerate(requests):
            try:
                frames.append(self._frame(request))
                owners.append(i)
            except Exception as exc:
                responses[i] = pb.InferenceResponse(error=pb.TritonError(str(exc)))
        try:
            results = self.predictor.predict_frames(frames) if frames else []
        except Exception as exc:
            for i in owners:
                responses[i] = pb.InferenceResponse(error=pb.TritonError(f"{type(exc).__name__}: {exc}"))
            return responses
        for i, result in zip(owners, results):
            tensors = [_tensor(name, value[None])
                       for name, value in result_tensors(result).items()]
            responses[i] = pb.InferenceResponse(output_tensors=tensors)
        return responses
