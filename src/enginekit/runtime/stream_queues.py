"""Where frames wait in a stream: the bounded queue between a source's decoding and the models, with its drop
policy (``DropQueue``), and the stop-aware ``get``/``put`` of the queues between threads."""

from __future__ import annotations

import collections
import queue
import threading
import time



#: ``--drop``: what happens when frames come faster than the models take them (the queue between
#: decoding and the models is full)
DROP_POLICIES: dict[str, str] = {
    "none": "never drop: decoding waits for room (every frame of a file is processed; a live camera falls "
            "behind, and its driver's own buffer drops frames)",
    "oldest": "the oldest waiting frame makes room for the new one: the models always get the freshest "
              "frame (least latency; for live cameras)",
    "newest": "the new frame is dropped and the frames already waiting go on (the first frames of a burst "
              "are kept)",
}

class DropQueue:
    """A bounded queue of frames with a drop policy (``DROP_POLICIES``); ``close()`` ends it."""

    def __init__(self, size: int, policy: str):
        self.size, self.policy = size, policy
        self.items: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.closed = False
        self._owed = False  # a frame was taken without waking the decoder (``get(wake=False)``)
        self.dropped: list[int] = []  # frame indices dropped

    def put(self, item, stop: threading.Event) -> None:
        with self.cond:
            if self.policy == "none":
                while len(self.items) >= self.size and not stop.is_set():
                    self.cond.wait(0.1)
            elif len(self.items) >= self.size:
                if self.policy == "newest":
                    self.dropped.append(item.index)
                    return
                self.dropped.append(self.items.popleft().index)
            self.items.append(item)
            self.cond.notify_all()

    def get(self, stop: threading.Event, *, wake: bool = True):
        """The next frame (a ``stream_records.Frame``); None once the queue is closed and empty (or the stream stops). ``wake=False``: the
        decoder waiting for room is not woken yet (``room``), so that it takes no share of the interpreter while
        the caller queues the frame's work on a GPU (on an H200 machine, Depth-Anything on torch: the network's
        launch 0.36 -> 0.24 ms after the step's dispatch, with the iterator's bookkeeping moved before it frees
        the step's slot)."""
        with self.cond:
            while not self.items and not self.closed and not stop.is_set():
                if self._owed:  # a frame taken without waking the decoder: it must go on to give this one
                    self._owed = False
                    self.cond.notify_all()
                self.cond.wait(0.1)
            if not self.items or stop.is_set():
                return None
            item = self.items.popleft()
            if wake:
                self._owed = False
                self.cond.notify_all()
            else:
                self._owed = True
            return item

    def waiting(self) -> list:
        """The frames waiting now, oldest first (a copy of the list)."""
        with self.cond:
            return list(self.items)

    def room(self) -> None:
        """Wake the decoder waiting for room, where a ``get(wake=False)`` has not yet."""
        with self.cond:
            if self._owed:
                self._owed = False
                self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()



_END = object()


def _get(q: "queue.Queue", stop: threading.Event, timeout: float | None = None):
    """``q.get`` that gives up when the stream stops (returns _END), or after ``timeout`` (returns None)."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    while not stop.is_set():
        wait = 0.1 if deadline is None else min(0.1, max(0.0, deadline - time.perf_counter()))
        try:
            return q.get(timeout=wait)
        except queue.Empty:
            if deadline is not None and time.perf_counter() >= deadline:
                return None
    return _END


def _put(q: "queue.Queue", item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


