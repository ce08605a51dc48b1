"""Real photographs for parity checks and calibration.

The embedded default uses photographs that ship inside installed packages (Ultralytics'
assets, scikit-image's data), so nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginekit.errors import UsageError
from enginekit.fsutil import special_file_kind

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}

# (package, relative path) of colour photographs
_EMBEDDED = [
    ("ultralytics", "assets/bus.jpg"),
    ("ultralytics", "assets/zidane.jpg"),
    ("skimage", "data/astronaut.png"),
    ("skimage", "data/coffee.png"),
    ("skimage", "data/chelsea.png"),
    ("skimage", "data/rocket.jpg"),
    ("skimage", "data/motorcycle_left.png"),
    ("skimage", "data/retina.jpg"),
]


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def embedded_image_paths() -> list[Path]:
    paths = []
    for package, rel in _EMBEDDED:
        root = _package_dir(package)
        if root is not None and (root / rel).is_file():
            paths.append(root / rel)
    return paths


def list_images(folder: Path, *, what: str = "image folder") -> list[Path]:
    """The image files in ``folder`` (by suffix), sorted; UsageError when there is none or it is unreadable."""
    if not folder.is_dir():
        raise UsageError(f"{what} not found: {folder}")
    try:
        # regular files only: a FIFO named x.jpg would block its read forever
        paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    except OSError as exc:
        raise UsageError(f"cannot read {what} {folder}: {exc.strerror}") from exc
    if not paths:
        raise UsageError(f"{what} {folder} has no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return paths


@dataclass
class ImageSet:
    images: list[np.ndarray]  # HxWx3 uint8 RGB
    paths: list[Path]
    skipped: list[str] = field(default_factory=list)  # "path: reason"


def read_bgr(path: Path) -> tuple[np.ndarray | None, str | None]:
    """(BGR uint8 H x W x 3, None), or (None, why not): not a regular file, not an image, or cut short.

    OpenCV decodes a truncated JPEG with a warning and grey where the data ended; such a file is
    refused here (Pillow decodes it strictly), so no one predicts or calibrates on half a picture.
    """
    import cv2

    kind = special_file_kind(path)
    if kind is not None:
        return None, f"is {kind}, not a regular file"
    if not Path(path).is_file():
        return None, "not found" if not Path(path).exists() else "is not a file"
    if _is_jpeg(path):  # checked first: libjpeg under OpenCV prints its own warning for a cut file
        problem = _jpeg_problem(path)
        if problem is not None:
            return None, problem
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)  # grayscale files come back as 3 channels
    if img is None:
        return None, "not a readable image"
    return img, None


def _is_jpeg(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(3) == b"\xff\xd8\xff"
    except OSError:
        return False


def _jpeg_problem(path: Path) -> str | None:
    """Why a JPEG OpenCV read is not whole (truncated, corrupt data), or None."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()  # decodes all of it; a cut file raises (LOAD_TRUNCATED_IMAGES is off)
    except (OSError, SyntaxError, ValueError) as exc:
        return f"a damaged image ({str(exc).split(' (')[0] or type(exc).__name__})"
    return None


def read_rgb(path: Path) -> np.ndarray | None:
    import cv2

    img, _ = read_bgr(path)
    if img is None:
        return None
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def images_of(source: Path | None = None, *, limit: int | None = None) -> list[Path]:
    """The image files ``load_images`` reads (the first ``limit`` candidates), without decoding any."""
    if source is None:
        paths = embedded_image_paths()
        if not paths:
            raise UsageError("no embedded photographs found: install ultralytics or scikit-image, or pass an image folder")
    else:
        paths = list_images(source)
    return paths[:limit] if limit is not None else paths


def load_images(source: Path | None = None, *, limit: int | None = None, leave_out=()) -> ImageSet:
    """Images from a folder (broken files skipped and reported) or the embedded default; ``leave_out``:
    files not to take (the images a graph was calibrated on, where it is judged apart from them)."""
    paths = images_of(source)
    result = ImageSet([], [])
    left_out = {Path(p).resolve() for p in leave_out}
    for p in paths:
        if left_out and p.resolve() in left_out:
            continue
        if limit is not None and len(result.images) >= limit:
            break
        img, problem = read_bgr(p)
        if img is None:
            result.skipped.append(f"{p.name}: {problem}")
            continue
        import cv2

        result.images.append(cv2.cvtColor(img, cv2.COLOR_BGR2RGB))
        result.paths.append(p)
    if not result.images:
        raise UsageError(f"no readable images in {source} ({len(result.skipped)} broken)")
    return result


#: the default video bench and tune stream when given no source: H x W
DEFAULT_VIDEO_HW = (720, 1280)


def write_video(path: Path, frames: int, size: tuple[int, int] = (1080, 1920), fps: float = 30.0) -> Path:
    """A video of ``frames`` frames at ``size`` (H, W) made from the embedded photographs: each photograph
    fills the frame (cropped to its aspect ratio) and the view pans and zooms a little from frame to frame,
    so no two frames are equal; a new photograph every 30 frames. MJPG in .avi, MP4V otherwise (OpenCV's
    own encoders: nothing to install). For streaming benchmarks, where a real decoder must read frames."""
    import cv2

    photos = [cv2.imread(str(p), cv2.IMREAD_COLOR) for p in embedded_image_paths()]
    photos = [p for p in photos if p is not None]
    if not photos:
        raise UsageError("no embedded photograph found: install ultralytics or scikit-image")
    h, w = size
    path = Path(path)
    fourcc = cv2.VideoWriter_fourcc(*("MJPG" if path.suffix.lower() == ".avi" else "mp4v"))
    writer = cv2.VideoWriter(str(path), fourcc, fps, (w, h))
    if not writer.isOpened():
        raise UsageError(f"OpenCV cannot write a video at {path}")
    try:
        for i in range(frames):
            photo = photos[(i // 30) % len(photos)]
            ph, pw = photo.shape[:2]
            zoom = 1.0 + 0.1 * ((i % 30) / 30.0)  # the crop narrows: a slow zoom
            crop_w = min(pw, ph * w / h) / zoom
            crop_h = crop_w * h / w
            x0 = (pw - crop_w) * ((i % 30) / 29.0 if ph else 0)  # and pans left to right
            y0 = (ph - crop_h) / 2
            window = photo[int(y0):int(y0 + crop_h), int(x0):int(x0 + crop_w)]
            writer.write(cv2.resize(window, (w, h), interpolation=cv2.INTER_LINEAR))
    finally:
        writer.release()
    return path
