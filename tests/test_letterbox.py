"""The .pt letterbox: YOLO graphs take any H x W, and the runtime letterboxes each frame to the smallest
stride-aligned rectangle around it, as ``YOLO(pt).predict`` does (``LetterBox(auto=True)``), so its boxes are
the .pt's on any aspect ratio; where the session takes only the square, it squares and says so.

Oracle: Ultralytics' own ``YOLO(weights).predict`` (default ``rect``) on the suite's trained detector, on an
810x1080 photograph (Ultralytics' bus.jpg is one) and on non-square photographs of the shapes it detects.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from test_runtime import _bus, _cuda, _same_detections


@pytest.fixture(scope="module")
def shape_photos(tmp_path_factory):
    """Photographs of the detector's shapes that are not square: 810x1080 (portrait, bus.jpg's size) and 1280x720."""
    import cv2

    from trained_detector import draw_image

    folder = tmp_path_factory.mktemp("rect-photos")
    rng = np.random.default_rng(21)
    paths = []
    for h, w in ((1080, 810), (720, 1280)):
        img, _ = draw_image(rng, h, w, (10, 16), (40, 120))  # shapes a little larger than in training: seen at 640
        paths.append(folder / f"shapes_{w}x{h}.png")
        cv2.imwrite(str(paths[-1]), img[..., ::-1])
    return paths


def _check_against_pt(predictor, weights, photos, imgsz=640) -> int:
    from ultralytics import YOLO

    model = YOLO(str(weights), task="detect")
    compared = 0
    for photo in photos:
        ref = model.predict(str(photo), imgsz=imgsz, verbose=False, device="cpu")[0].boxes  # rect, as users run it
        ours = predictor(photo)
        if len(ref) == 0:
            assert len(ours) == 0, photo.name
            continue
        _same_detections(ours, ref.xyxy.numpy(), ref.conf.numpy(), ref.cls.numpy().astype(int), iou=0.99, score_tol=1e-3)
        compared += len(ref)
    return compared


@pytest.mark.parametrize("backend", ["onnxruntime-cpu", "torch"])
def test_non_square_frames_give_the_pt_predict_boxes(backend, trained_detector, shape_photos, cache):
    import enginekit

    predictor = enginekit.load(trained_detector.model, weights=trained_detector.weights, backend=backend,
                               device="cpu", cache=cache)
    assert "smallest 32-aligned rectangle" in predictor.reason, predictor.reason
    assert predictor.processor.input_hw((1080, 810)) == (640, 480)
    assert predictor.processor.input_hw((720, 1280)) == (384, 640)
    compared = _check_against_pt(predictor, trained_detector.weights, [_bus(), *shape_photos])
    assert compared >= 10, "too few detections compared: the check would not tell rectangle from square"


def test_square_letterbox_would_have_differed(trained_detector, shape_photos):
    """The check above can fail: on the same photograph the square letterbox (what a fixed 640x640 graph gets)
    gives boxes or scores the .pt's rectangle does not."""
    from ultralytics import YOLO

    model = YOLO(str(trained_detector.weights), task="detect")
    rect = model.predict(str(shape_photos[0]), imgsz=640, verbose=False, device="cpu")[0].boxes
    square = model.predict(str(shape_photos[0]), imgsz=640, rect=False, verbose=False, device="cpu")[0].boxes
    assert len(rect) > 0
    differs = len(rect) != len(square)
    if not differs:
        j = np.argsort(-rect.conf.numpy())
        k = np.argsort(-square.conf.numpy())
        differs = np.abs(rect.conf.numpy()[j] - square.conf.numpy()[k]).max() > 1e-3
    assert differs


def test_fixed_square_graph_squares_and_says_so(trained_detector, shape_photos, cache, tmp_path):
    """A graph whose input is fixed at 640x640 (another tool's export): square letterbox, said in the reason,
    and then the boxes of Ultralytics' square letterbox (rect=False)."""
    import onnx
    from ultralytics import YOLO

    import enginekit
    from enginekit.runtime import load as runtime_load

    dynamic = enginekit.load(trained_detector.model, weights=trained_detector.weights, backend="onnxruntime-cpu",
                             cache=cache).source
    graph = onnx.load(dynamic)
    for d, v in zip(graph.graph.input[0].type.tensor_type.shape.dim[2:], (640, 640)):
        d.ClearField("dim_param")
        d.dim_value = v
    fixed = tmp_path / "fixed.onnx"
    onnx.save(graph, str(fixed))
    predictor = runtime_load(fixed, backend="onnxruntime-cpu")
    assert "square" in predictor.reason and "not YOLO(pt).predict's rectangle" in predictor.reason, predictor.reason
    assert predictor.processor.input_hw((1080, 810)) == (640, 640)
    model = YOLO(str(trained_detector.weights), task="detect")
    ref = model.predict(str(shape_photos[0]), imgsz=640, rect=False, verbose=False, device="cpu")[0].boxes
    ours = predictor(shape_photos[0])
    _same_detections(ours, ref.xyxy.numpy(), ref.conf.numpy(), ref.cls.numpy().astype(int))


def test_engine_profiles_decide_the_rectangle():
    """An engine takes the rectangle where one of its profiles covers it; a graph of dynamic H/W takes any."""
    from enginekit.backends.base import SessionInfo

    def info(*profiles):
        return SessionInfo("tensorrt", "cuda:0", "images", ("output0",), (None, 3, None, None),
                           profiles=[{"images": {"min": list(lo), "opt": list(hi), "max": list(hi)}} for lo, hi in
                                     profiles])

    square = info(((1, 3, 640, 640), (1, 3, 640, 640)))
    assert square.fixed_hw == (640, 640) and not square.accepts_hw((480, 640))
    ranged = info(((1, 3, 320, 320), (8, 3, 640, 640)))
    assert ranged.fixed_hw is None and ranged.accepts_hw((480, 640)) and not ranged.accepts_hw((704, 640))
    assert SessionInfo("onnxruntime-cpu", "cpu", "images", (), (None, 3, None, None)).accepts_hw((384, 640))
    assert not SessionInfo("onnxruntime-cpu", "cpu", "images", (), (None, 3, 640, 640)).accepts_hw((384, 640))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["onnxruntime-cuda", "torch"])
def test_non_square_frames_give_the_pt_predict_boxes_on_the_gpu(backend, trained_detector, shape_photos, cache):
    """The same oracle on a GPU: the rectangle letterboxed by the GPU preprocessing (bilinear on the device,
    a grey level from OpenCV's rounding), ONNX Runtime's CUDA graph captured per rectangle."""
    if not _cuda():
        pytest.skip("needs a CUDA GPU")
    import enginekit

    predictor = enginekit.load(trained_detector.model, weights=trained_detector.weights, backend=backend,
                               cache=cache)
    assert predictor.device.startswith("cuda") and "smallest 32-aligned rectangle" in predictor.reason
    compared = _check_against_pt(predictor, trained_detector.weights, [_bus(), *shape_photos])
    assert compared >= 10
