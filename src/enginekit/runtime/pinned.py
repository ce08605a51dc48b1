"""Page-locked (pinned) frame buffers: a stream's decoder reads frames straight into them, so a frame goes to the GPU
in one asynchronous copy, with no copy into a staging buffer first (6 MB for a 1080p frame: about half a millisecond
of host time per frame and model, on the frame's critical path).

A buffer is lent as a NumPy array; it comes back to its pool once that array and every view of it are gone (the
caller may keep a frame as long as it likes: the pool then makes another buffer, up to ``limit``, and past that
lends ordinary memory), and is lent again only after the last copy that read it has finished (``uploaded``).
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import numpy as np

#: address of a lent buffer's memory -> [its pinned tensor, the event of the last copy that read it, its copy on the
#: device already made (``PinnedFrames.upload``: (device tensor, event)) or None, how many times it was lent]
_LENT: dict[int, list] = {}
_LOCK = threading.Lock()


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def pinned_tensor(frame) -> object | None:
    """The pinned tensor whose memory ``frame`` (a whole lent buffer, contiguous) is; None for any other array."""
    if not isinstance(frame, np.ndarray) or not frame.flags.c_contiguous:
        return None
    entry = _LENT.get(_address(frame))
    if entry is None or tuple(entry[0].shape) != frame.shape or frame.dtype != np.uint8:
        return None
    return entry[0]


def token(frame) -> tuple | None:
    """What tells this lending of a whole lent buffer from any other (its address and how many times it was lent):
    a frame copied somewhere ahead of its step is known again by it (``PinnedFrames.copy_into``); None for any
    other array."""
    if not isinstance(frame, np.ndarray):
        return None
    address = _address(frame)
    entry = _LENT.get(address)
    if entry is None or entry[0].shape != frame.shape:
        return None
    return address, entry[3]


def on_device(frame, device, stream=None):
    """The copy of ``frame`` (a whole lent buffer) already queued to ``device`` (``upload``), made safe
    to read on ``stream`` (default: the current one), which waits for the copy; None where there is none."""
    import torch

    if not isinstance(frame, np.ndarray):
        return None
    entry = _LENT.get(_address(frame))  # not ``frame.ctypes``: it makes a ctypes object per call
    if entry is None or entry[2] is None or entry[0].shape != frame.shape:
        return None
    copy, done = entry[2]
    if copy.device != device:
        return None
    if stream is None:
        stream = torch.cuda.current_stream(copy.device)
    stream.wait_event(done)
    copy.record_stream(stream)  # made on the pool's stream: not reused before this stream has read it
    return copy


def uploaded(tensor, event) -> None:
    """``event`` marks the end of a copy that reads ``tensor``'s buffer: the buffer is not lent again before it."""
    entry = _LENT.get(tensor.data_ptr())
    if entry is not None:
        entry[1] = event


class PinnedFrames:
    """A pool of pinned uint8 frame buffers, by shape. ``take(shape)`` lends one as a NumPy array."""

    def __init__(self, limit: int = 32, device=None):
        self.limit = limit
        self.device = device  # where ``upload`` copies a frame before its step (None: nowhere)
        self._stream = None
        self._free: dict[tuple, list] = {}  # shape -> pinned tensors not lent
        self._made: list = []
        self._closed = False
        # held while a model may capture a CUDA graph (``held``): the decoder's CUDA calls (pinned allocation, event
        # queries, its copies) wait, since a capture in CUDA's global mode (ONNX Runtime's) fails on any of them
        self._cuda = threading.Lock()

    @contextlib.contextmanager
    def held(self):
        """No CUDA call from the pool (the decoding thread waits) while this is entered: a stream's warm-ups, where
        a backend captures its graph."""
        with self._cuda:
            yield

    def take(self, shape: tuple) -> np.ndarray:
        shape = tuple(int(v) for v in shape)
        with self._cuda:
            return self._take(shape)

    def _take(self, shape: tuple) -> np.ndarray:
        import torch

        tensor = None
        with _LOCK:
            free = self._free.get(shape, [])
            for i, t in enumerate(free):
                event = _LENT[t.data_ptr()][1]
                if event is None or event.query():
                    tensor = free.pop(i)
                    break
            if tensor is None and (self._closed or len(self._made) >= self.limit):
                return np.empty(shape, np.uint8)
        if tensor is None:
            tensor = torch.empty(shape, dtype=torch.uint8).pin_memory()
            with _LOCK:
                self._made.append(tensor)
                _LENT[tensor.data_ptr()] = [tensor, None, None, 0]
        entry = _LENT[tensor.data_ptr()]
        entry[2] = None  # its device copy was of the frame before
        entry[3] += 1
        array = tensor.numpy()
        weakref.finalize(array, self._give_back, shape, tensor)
        return array

    def upload(self, frame: np.ndarray) -> None:
        """Queue ``frame``'s copy to ``device`` (on a stream of the pool's own) while it waits for its step (a stream's
        dispatching thread, once the step before is queued): a model that takes the whole frame on the device then
        finds it there (``on_device``), its copy overlapped with the steps before. Nothing for an array the pool did
        not lend, or one copied already."""
        import torch

        entry = _LENT.get(_address(frame)) if self.device is not None else None
        if entry is None or entry[2] is not None:
            return
        with self._cuda:
            self._upload(entry)

    def _upload(self, entry: list) -> None:
        import torch

        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        with torch.cuda.stream(self._stream):
            copy = entry[0].to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        entry[1], entry[2] = done, (copy, done)

    def copy_into(self, frame: np.ndarray, dest, after=None):
        """Queue ``frame``'s copy (a whole lent buffer) into ``dest`` (a tensor of its shape on ``device``, a CUDA
        graph's own input) on the pool's stream, once ``after`` (an event: where the last reader of ``dest`` is done
        with it) has happened. Returns the event that ends the copy (the caller's stream waits for it), or None
        where ``frame`` is not such a buffer; the buffer is not lent again before the copy has read it."""
        import torch

        entry = _LENT.get(_address(frame)) if self.device is not None else None
        if entry is None or entry[0].shape != frame.shape or tuple(dest.shape) != frame.shape:
            return None
        with self._cuda:
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)
            if after is not None:
                self._stream.wait_event(after)
            with torch.cuda.stream(self._stream), torch.inference_mode():  # a graph's input: an inference tensor
                dest.copy_(entry[0], non_blocking=True)
                done = torch.cuda.Event()
                done.record(self._stream)
            entry[1] = done
        return done

    def _give_back(self, shape: tuple, tensor) -> None:
        with _LOCK:
            if not self._closed:
                self._free.setdefault(shape, []).append(tensor)

    def close(self) -> None:
        """No more lending; buffers still held by arrays stay valid (they are freed with the last array), but are
        no longer recognised as pinned."""
        with _LOCK:
            self._closed = True
            for t in self._made:
                _LENT.pop(t.data_ptr(), None)
            self._free.clear()
            self._made.clear()

    def __len__(self) -> int:
        return len(self._made)


def pool_for(predictors) -> PinnedFrames | None:
    """A pool where some predictor runs on a CUDA device (pinned memory needs one), else None; its frames are copied to
    that device as soon as they are decoded where every such predictor runs on the same one."""
    gpus = {str(p.info.device) for p in predictors if getattr(p.info, "on_gpu", False)}
    if not gpus:
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    return PinnedFrames(device=torch.device(gpus.pop()) if len(gpus) == 1 else None)
