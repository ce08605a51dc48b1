"""The .pt letterbox: YOLO graphs take any H x W, and the runtime letterboxes each frame to the smallest
stride-aligned rectangle around it, as ``YOLO(pt).predict`` does (``LetterBox(auto=True)``), so its boxes are
the .pt's on any aspect ratio; where the session takes only the square, it squares and says so.

Oracle: Ultralytics' own ``YOLO(weights).predict`` (default ``rect``) on the suite's trained detector, on an
810x1080 photograph (Ultralytics' bus.jpg is one) and on non-square photographs of the shapes it detects; and
for the input itself, its predictor's own ``preprocess`` (``pre_transform``'s LetterBox, then to float), bit
for bit, through every preprocessing path the runtime has (a session on the CPU; a session on a GPU, run with
its device steps on the CPU).
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
    """The same oracle on a GPU: the rectangle letterboxed with OpenCV on the host as Ultralytics does, the
    rest on the device; ONNX Runtime's CUDA graph captured per rectangle."""
    if not _cuda():
        pytest.skip("needs a CUDA GPU")
    import enginekit

    predictor = enginekit.load(trained_detector.model, weights=trained_detector.weights, backend=backend,
                               cache=cache)
    assert predictor.device.startswith("cuda") and "smallest 32-aligned rectangle" in predictor.reason
    compared = _check_against_pt(predictor, trained_detector.weights, [_bus(), *shape_photos])
    assert compared >= 10


def _frames() -> dict[str, np.ndarray]:
    """BGR frames of several shapes: bus.jpg (810x1080), zidane.jpg (a 1280x720 video frame), an odd crop (its
    padding splits unevenly) and a small frame (scaled up)."""
    import cv2

    bus = cv2.imread(str(_bus()))
    zidane = cv2.imread(str(_bus().with_name("zidane.jpg")))
    assert bus.shape == (1080, 810, 3) and zidane.shape == (720, 1280, 3)
    return {"bus": bus, "zidane": zidane, "odd": np.ascontiguousarray(bus[101:638, 3:704]),
            "small": np.ascontiguousarray(zidane[200:443, 500:821])}


@pytest.fixture(scope="module")
def pt_inputs(trained_detector):
    """Each frame as ``YOLO(pt).predict`` feeds it to the network: its predictor's own ``preprocess``."""
    from ultralytics import YOLO

    model = YOLO(str(trained_detector.weights), task="detect")
    inputs = {}
    for name, bgr in _frames().items():
        model.predict(bgr, imgsz=640, verbose=False, device="cpu")  # its predictor, set up as users run it
        inputs[name] = model.predictor.preprocess([bgr]).numpy()
    return inputs


@pytest.fixture(scope="module")
def cpu_predictors(trained_detector, cache):
    import enginekit

    return {backend: enginekit.load(trained_detector.model, weights=trained_detector.weights, backend=backend,
                                    device="cpu", cache=cache) for backend in ("onnxruntime-cpu", "torch")}


def test_the_runtime_feeds_the_pt_predict_input_bit_for_bit(cpu_predictors, pt_inputs):
    """The input the runtime makes of a frame is the tensor Ultralytics' predictor makes, exactly: the host
    path (sessions on the CPU), the GPU path (OpenCV letterbox on the host, then the uint8 upload and the
    device's steps, run here on the CPU), and the references verify checks against (``preprocess_rect``)."""
    frames = _frames()
    shapes = {name: pt_inputs[name].shape[2:] for name in frames}
    assert shapes == {"bus": (640, 480), "zidane": (384, 640), "odd": (512, 640), "small": (512, 640)}
    for backend, predictor in cpu_predictors.items():
        for name, bgr in frames.items():
            want = pt_inputs[name]
            hw = predictor.processor.input_hw(bgr.shape[:2])
            assert tuple(hw) == want.shape[2:], (backend, name, hw)
            host = predictor.preprocess_cpu([bgr], hw)
            assert host.dtype == np.float32 and np.array_equal(host, want), (backend, name, np.abs(host - want).max())
            device = predictor.device_input([bgr], hw, rgb=False, device="cpu").numpy()
            assert np.array_equal(device, want), (backend, name, np.abs(device - want).max())
            rgb = np.ascontiguousarray(bgr[..., ::-1])
            assert np.array_equal(predictor.device_input([rgb], hw, rgb=True, device="cpu").numpy(), want)
    adapter = cpu_predictors["torch"].processor.adapter
    for name, bgr in frames.items():
        assert np.array_equal(adapter.preprocess_rect(np.ascontiguousarray(bgr[..., ::-1]), (640, 640)), pt_inputs[name])


def test_the_gpu_letterbox_is_the_pt_input_and_the_default(trained_detector, cache, pt_inputs, cpu_predictors):
    """A GPU session takes the whole frame to the device and letterboxes it there with OpenCV's own arithmetic
    (``exact_resize``): run on CPU tensors, the same steps give Ultralytics' input bit for bit, with or without the
    old ``gpu_letterbox`` flag (a no-op now); no frame is letterboxed on the host first."""
    import enginekit

    default = cpu_predictors["torch"].processor
    assert not default.host_step((1080, 810), (640, 480))
    opted = enginekit.load(trained_detector.model, weights=trained_detector.weights, backend="torch",
                           device="cpu", cache=cache, gpu_letterbox=True)
    for predictor in (cpu_predictors["torch"], opted):
        for name, bgr in _frames().items():
            hw = predictor.processor.input_hw(bgr.shape[:2])
            resized = predictor.device_input([bgr], hw, device="cpu").numpy()
            assert np.array_equal(resized, pt_inputs[name]), (name, np.abs(resized - pt_inputs[name]).max())


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["onnxruntime-cuda", "torch"])
def test_the_gpu_input_is_the_pt_predict_input_on_the_gpu(backend, trained_detector, cache):
    """On the GPU too, the session's input is the tensor Ultralytics' predictor builds on the same device, bit
    for bit (its letterbox on the host, then uint8 to the device, HWC to CHW, BGR to RGB, ``div_(255)`` there),
    through the predictor's GPU path as frames take it (the captured preprocessing replayed)."""
    if not _cuda():
        pytest.skip("needs a CUDA GPU")
    import torch
    from ultralytics import YOLO

    import enginekit

    predictor = enginekit.load(trained_detector.model, weights=trained_detector.weights, backend=backend,
                               cache=cache)
    assert predictor.device.startswith("cuda")
    model = YOLO(str(trained_detector.weights), task="detect")
    for name, bgr in _frames().items():
        model.predict(bgr, imgsz=640, verbose=False, device=predictor.device)
        want = model.predictor.preprocess([bgr])
        hw = predictor.processor.input_hw(bgr.shape[:2])
        stream = predictor.stream or torch.cuda.current_stream()
        with torch.cuda.stream(stream), torch.inference_mode():
            got = [predictor.device_input([bgr], hw).clone() for _ in range(2)]  # captured, then replayed
        torch.cuda.synchronize()
        for g in got:
            assert g.shape == want.shape and torch.equal(g, want), (name, (g - want).abs().max().item())
    assert "letterboxed on the GPU with OpenCV's arithmetic" in predictor.reason, predictor.reason


def test_the_reason_says_where_frames_are_resized_on_the_gpu():
    """``predictor.reason`` carries the processor's note: on a GPU, where frames are letterboxed (exactly)."""
    from enginekit.backends.base import SessionInfo
    from enginekit.families import resolve
    from enginekit.families.ultralytics.runtime import YoloProcessor

    adapter = resolve("yolov8n")
    gpu = SessionInfo("onnxruntime-cuda", "cuda:0", "images", ("output0",), (None, 3, None, None))
    cpu = SessionInfo("onnxruntime-cpu", "cpu", "images", ("output0",), (None, 3, None, None))
    for flag in (False, True):  # gpu_letterbox: a no-op now
        on_gpu = YoloProcessor(adapter, {}, gpu, gpu_letterbox=flag).input_note
        assert "smallest 32-aligned rectangle" in on_gpu and "letterboxed on the GPU with OpenCV's arithmetic" in on_gpu
        assert "on the GPU" not in YoloProcessor(adapter, {}, cpu, gpu_letterbox=flag).input_note  # resized on the host
