"""Frame sources for ``enginekit predict``: an image, a folder of images, a video file, a camera index.

Every source is opened (and its first frame read) before any model loads, so bad input fails
at once with one line: an unreadable image, a video that does not open, an absent camera.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from enginekit.errors import UsageError
from enginekit.fsutil import refuse_special_file
from enginekit.images import read_bgr

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg"}


@dataclass
class FrameSource:
    kind: str  # "image" | "folder" | "video" | "camera"
    name: str
    count: int | None  # None: a camera (endless)
    fps: float
    _frames: Iterator[tuple[str, np.ndarray]]
    #: a video's or camera's reader: ``[take]``, where ``take(shape)`` lends the array the next frame is decoded into
    _into: list | None = None

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        return self._frames

    def frames_into(self, take) -> Iterator[tuple[str, np.ndarray]]:
        """The frames, each in an array from ``take(shape)`` (e.g. pinned memory, ``runtime.pinned``): a video or
        camera decodes straight into it; images read before are copied into it."""
        if self._into is not None:
            self._into[0] = take
            return self._frames
        return ((name, _copied(frame, take)) for name, frame in self._frames)


def _copied(frame: np.ndarray, take) -> np.ndarray:
    if frame.dtype != np.uint8 or frame.ndim != 3:
        return frame
    out = take(frame.shape)
    np.copyto(out, frame)
    return out


def _read(path: Path) -> np.ndarray:
    img, problem = read_bgr(path)
    if img is None:
        raise UsageError(f"not a readable image: {path} ({problem})" if problem != "not a readable image"
                         else f"not a readable image: {path}")
    return img


def _capture(cap, first, stem: str, limit: int | None, into: list) -> Iterator[tuple[str, np.ndarray]]:
    """``into[0]``, once set (``FrameSource.frames_into``): lends the array each next frame is decoded into
    (OpenCV writes into an array of the frame's shape and type, and makes a new one otherwise)."""
    try:
        i = 0
        frame = first
        while frame is not None and (limit is None or i < limit):
            yield f"{stem}:{i}", frame
            i += 1
            take = into[0]
            ok, frame = cap.read(take(frame.shape)) if take is not None else cap.read()
            if not ok:
                frame = None
    finally:
        cap.release()


def open_source(source: str, *, max_frames: int | None = None) -> FrameSource:
    import cv2

    if source.isdigit():
        index = int(source)
        cap = cv2.VideoCapture(index)
        ok, first = cap.read() if cap.isOpened() else (False, None)
        if not ok:
            cap.release()
            raise UsageError(f"camera {index} is absent or gives no frames")
        into: list = [None]
        return FrameSource("camera", f"camera{index}", max_frames, cap.get(cv2.CAP_PROP_FPS) or 30.0,
                           _capture(cap, first, f"camera{index}", max_frames, into), into)
    path = Path(source)
    if not path.exists():
        raise UsageError(f"source not found: {path} (an image, a folder, a video file, or a camera index)")

    refuse_special_file(path, "source")  # a FIFO or device: OpenCV would wait on it forever
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not files:
            raise UsageError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {path}")
        files = files[:max_frames] if max_frames else files
        frames = [(str(p), _read(p)) for p in files]  # all readable, or nothing runs
        return FrameSource("folder", path.name, len(frames), 0.0, iter(frames))
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return FrameSource("image", path.stem, 1, 0.0, iter([(str(path), _read(path))]))
    cap = cv2.VideoCapture(str(path))
    ok, first = cap.read() if cap.isOpened() else (False, None)
    if not ok:
        cap.release()
        if path.suffix.lower() in VIDEO_SUFFIXES:
            raise UsageError(f"video {path} does not open")
        raise UsageError(f"{path} is neither a readable image nor a video")
    n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) or None
    if max_frames and n:
        n = min(n, max_frames)
    into = [None]
    return FrameSource("video", path.stem, n, cap.get(cv2.CAP_PROP_FPS) or 30.0,
                       _capture(cap, first, path.stem, max_frames, into), into)


def draw(frame: np.ndarray, result) -> np.ndarray:
    """An overlay: a YOLO result drawn by Ultralytics' ``Results.plot`` (boxes, masks, keypoints, rotated
    boxes, top-5 classes), or the depth map in a colour map."""
    import cv2

    if getattr(result, "kind", "") == "depth":
        d = result.depth
        lo, hi = float(np.nanmin(d)), float(np.nanmax(d))
        norm = ((d - lo) / (hi - lo + 1e-12) * 255).astype(np.uint8)
        return cv2.applyColorMap(norm, cv2.COLORMAP_INFERNO)
    return result.plot(np.ascontiguousarray(frame))
