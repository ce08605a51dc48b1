"""enginekit.load(), the predictors' results contract, and enginekit predict.

Oracles: Ultralytics' own ``YOLO(weights).predict`` for detections (on a trained detector), the
PyTorch module's own output for depth, and the backends against each other.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error


def _bus():
    from enginekit.images import embedded_image_paths

    return next(p for p in embedded_image_paths() if p.name == "bus.jpg")


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(br - tl, 0, None).prod(-1)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None] - inter + 1e-9)


def _same_detections(ours, boxes, scores, classes, *, iou=0.99, score_tol=1e-3):
    assert len(ours) == len(scores) > 0, (len(ours), len(scores))
    m = _iou(ours.boxes, boxes)
    j = m.argmax(1)
    assert m.max(1).min() >= iou, m.max(1)
    assert (ours.class_ids == classes[j]).all()
    assert np.abs(ours.scores - scores[j]).max() <= score_tol


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="module")
def yolo_onnx(tmp_path_factory, cache):
    from enginekit import api
    from enginekit.flows.load import simplifier as _simplifier

    out = tmp_path_factory.mktemp("rt-yolo")
    return api.export("yolo12n", random_init=True, output=out / "yolo12n.onnx", cache=cache, quiet=True,
                      simplifier=_simplifier()).output


@pytest.fixture(scope="module")
def small_photo(tmp_path_factory):
    """A real photograph, shrunk so Depth-Anything runs in seconds on a CPU (aspect ratio kept)."""
    import cv2

    img = cv2.imread(str(_bus()))
    small = cv2.resize(img, (105, 140), interpolation=cv2.INTER_AREA)
    path = tmp_path_factory.mktemp("rt-photo") / "bus-small.png"
    cv2.imwrite(str(path), small)
    return path


# -- the external oracle: Ultralytics' own predictor ----------------------------------------------------
def test_onnx_cpu_matches_ultralytics_predict_on_trained_detector(trained_detector, detector_images, cache):
    """FP32 ONNX on ORT CPU through load() == Ultralytics' own YOLO(weights).predict, per photograph."""
    from ultralytics import YOLO

    import enginekit

    model = YOLO(str(trained_detector.weights), task="detect")
    predictor = enginekit.load(trained_detector.model, weights=trained_detector.weights, backend="onnxruntime-cpu",
                               cache=cache)
    assert predictor.backend == "onnxruntime-cpu"
    compared = 0
    for photo in sorted(Path(detector_images).iterdir()):
        # imgsz 640, as the graph was exported at (the checkpoint was trained at 160); the graph takes any H x W,
        # so each photograph goes to its smallest 32-aligned rectangle, as the .pt predict letterboxes it
        ref = model.predict(str(photo), imgsz=640, verbose=False, device="cpu")[0].boxes
        ours = predictor(photo)
        if len(ref) == 0:
            assert len(ours) == 0, photo.name
            continue
        _same_detections(ours, ref.xyxy.numpy(), ref.conf.numpy(), ref.cls.numpy().astype(int))
        assert ours.names == [model.names[int(c)] for c in ours.class_ids]
        compared += len(ref)
    assert compared > 0, "the trained detector found nothing on any photograph: the check compared nothing"


def test_depth_equals_pytorch_output_resized(small_photo, cache):
    import cv2
    import torch
    import torch.nn.functional as F

    import enginekit
    from enginekit.families import resolve
    from enginekit.families.depth_anything.runtime import lower_bound_size

    predictor = enginekit.load("depth", random_init=True, backend="onnxruntime-cpu", input_size=140, cache=cache)
    got = predictor(small_photo)
    bgr = cv2.imread(str(small_photo))
    assert got.depth.shape == bgr.shape[:2] and got.depth.dtype == np.float32
    hw = lower_bound_size(*bgr.shape[:2], 140)
    assert hw == (182, 140) and all(s % 14 == 0 for s in hw)
    adapter = resolve("depth")
    module = adapter.load(None, random_init=True, seed=0).module
    x = adapter.preprocess(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), hw)
    with torch.inference_mode():
        ref = module(torch.from_numpy(x))
    ref = F.interpolate(ref[:, None], size=bgr.shape[:2], mode="bilinear", align_corners=True)[0, 0].numpy()
    rel = np.linalg.norm(got.depth - ref) / np.linalg.norm(ref)
    assert rel < 1e-4, rel
    assert np.std(ref) > 0  # a constant map would compare nothing


def test_onnxruntime_cpu_and_torch_cpu_agree(trained_detector, detector_images, cache):
    """Two backends, one trained detector: the same detections, scores within 1e-4 of each other where
    the scores themselves spread over tenths (a random YOLO's all sit near 1e-4: no check at all)."""
    import cv2

    import enginekit

    kw = dict(weights=trained_detector.weights, conf=0.05, max_det=50, cache=cache)
    ort_p = enginekit.load(trained_detector.model, backend="onnxruntime-cpu", **kw)
    torch_p = enginekit.load(trained_detector.model, backend="torch", device="cpu", **kw)
    assert (ort_p.backend, torch_p.backend) == ("onnxruntime-cpu", "torch")
    shapes = sorted(p for p in Path(detector_images).iterdir() if p.suffix == ".png")[:2]
    frames = [cv2.imread(str(p)) for p in shapes]
    frames.append(frames[0][:400, 80:])  # not square
    a, b = ort_p(frames), torch_p(frames)
    scores = np.concatenate([y.scores for y in b])
    assert len(scores) >= 5 and scores.max() - scores.min() > 0.3, scores  # something to compare
    for x, y in zip(a, b):
        if len(y) == 0:  # the crop may hold no shape: then neither finds one
            assert len(x) == 0
            continue
        _same_detections(x, y.boxes, y.scores, y.class_ids, iou=0.999, score_tol=1e-4)
    # the same image given as RGB with rgb=True gives the same result
    rgb = np.ascontiguousarray(frames[0][..., ::-1])
    c = ort_p(rgb, rgb=True)
    np.testing.assert_allclose(c.boxes, a[0].boxes, atol=1e-3)
    assert json.loads(json.dumps(c.to_json()))["kind"] == "detections"


def test_auto_backend_says_why(yolo_onnx):
    import enginekit

    p = enginekit.load(str(yolo_onnx), device="cpu")
    assert p.backend == "onnxruntime-cpu" and "CPU" in p.reason


def test_letterbox_geometry_matches_ultralytics():
    from ultralytics.data.augment import LetterBox

    from enginekit.families.ultralytics.runtime import letterbox_geometry

    for h, w in ((1080, 810), (720, 1280), (333, 500), (640, 640), (1080, 1920), (359, 1000)):
        img = np.zeros((h, w, 3), np.uint8)
        for auto in (False, True):
            out = LetterBox((640, 640), auto=auto)(image=img + 1)
            (uh, uw), top, bottom, left, right = letterbox_geometry((h, w), (640, 640), auto=auto)
            assert (uh + top + bottom, uw + left + right) == out.shape[:2]
            assert (out[top:top + uh, left:left + uw] == 1).all()


# -- the predict command -----------------------------------------------------------------------------------
def test_predict_writes_overlays_and_json(run_cli, tmp_path, yolo_onnx, small_photo):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.png").write_bytes(Path(small_photo).read_bytes())
    (folder / "b.png").write_bytes(Path(small_photo).read_bytes())
    r = run_cli("predict", str(yolo_onnx), str(folder), "--backend", "onnxruntime-cpu", "--conf", "0.0001",
                "--save", str(tmp_path / "out"))
    assert r.code == 0, r.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(data["frames"]) == 2 and data["models"][0]["backend"] == "onnxruntime-cpu"
    first = data["frames"][0]["results"]["yolo12n"]
    assert first["detections"] and (tmp_path / "out" / first["overlay"]).is_file()
    assert set(data["summary"]["models"]["yolo12n"]) == {"preprocess_ms", "infer_ms", "postprocess_ms"}


def test_predict_video_with_two_models(run_cli, tmp_path, yolo_onnx, small_photo, cache):
    import cv2

    img = cv2.imread(str(small_photo))
    video = tmp_path / "clip.avi"
    w = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (img.shape[1], img.shape[0]))
    for i in range(2):
        w.write(np.roll(img, i * 5, axis=1))
    w.release()
    r = run_cli("predict", f"{yolo_onnx},depth", str(video), "--random-init", "--backend", "onnxruntime-cpu",
                "--save", str(tmp_path / "out"))
    assert r.code == 0, r.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(data["frames"]) == 2
    assert set(data["frames"][0]["results"]) == {"yolo12n", "depth-anything-v2-small"}
    assert (tmp_path / "out" / "clip_depth-anything-v2-small.mp4").is_file()


@pytest.mark.parametrize("case", ["unreadable", "video", "camera", "missing"])
def test_predict_bad_input_is_one_line_and_writes_nothing(run_cli, tmp_path, case):
    bad = {"unreadable": tmp_path / "broken.jpg", "video": tmp_path / "broken.mp4", "camera": "7",
           "missing": tmp_path / "nothing-here.png"}[case]
    if case in ("unreadable", "video"):
        Path(bad).write_bytes(b"not an image or a video")
    out = tmp_path / "out"
    r = run_cli("predict", "yolo12n", str(bad), "--random-init", "--save", str(out))
    assert_one_line_error(r, 2)
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_engine_for_another_tensorrt_or_gpu_is_refused():
    from enginekit.errors import CapabilityError
    from enginekit.trt.session import check_runs_here

    manifest = {"backend": "tensorrt-10", "backend_version": "10.0.0.1", "targets": [],
                "gpu": {"name": "Tesla T4", "compute_capability": "7.5"}}
    with pytest.raises(CapabilityError, match="cannot run here"):
        check_runs_here(manifest)


def test_shape_outside_every_profile_is_a_usage_error():
    from enginekit.errors import UsageError
    from enginekit.trt.session import profile_for, torch_dtype_name

    profiles = [{"x": {"min": [1, 3, 224, 224], "opt": [1, 3, 518, 518], "max": [4, 3, 518, 518]}},
                {"x": {"min": [1, 3, 518, 518], "opt": [8, 3, 518, 518], "max": [8, 3, 1022, 1022]}}]
    assert profile_for((2, 3, 280, 280), profiles, "x") == 0
    assert profile_for((8, 3, 700, 518), profiles, "x") == 1
    with pytest.raises(UsageError, match="outside every optimization profile"):
        profile_for((1, 3, 1036, 518), profiles, "x")
    assert torch_dtype_name("DataType.HALF") == "float16"


def test_providers_report_loading_not_just_compiled():
    from enginekit.backends.providers import onnxruntime_providers

    found = {p.name: p for p in onnxruntime_providers()}
    assert found["CPUExecutionProvider"].loads is True
    for name, p in found.items():
        if name == "CPUExecutionProvider" or p.loads is None:
            continue
        assert p.loads or "needs" in p.detail or "not" in p.detail, p  # a failure names what is missing


# -- GPU ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_onnxruntime_cuda_agrees_with_torch_cuda(yolo_onnx, cache):
    if not _cuda():
        pytest.skip("needs a CUDA GPU")
    import torch

    import enginekit

    ort_p = enginekit.load(str(yolo_onnx), backend="onnxruntime-cuda", conf=1e-4, max_det=100)
    torch_p = enginekit.load("yolo12n", random_init=True, backend="torch", conf=1e-4, max_det=100, cuda_graph=False,
                             cache=cache)
    assert ort_p.device.startswith("cuda") and torch_p.device.startswith("cuda")
    x = torch.rand((2, 3, 640, 640), device="cuda")
    with torch.cuda.stream(ort_p.stream):
        a = ort_p.session(x)["output0"].clone()
    torch.cuda.synchronize()
    b = torch_p.session(x)["output0"]
    assert (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item() < 1e-3  # TF32 convolutions on both sides
    bgr = __import__("cv2").imread(str(_bus()))
    host, dev = ort_p(bgr), ort_p(torch.from_numpy(bgr).cuda())
    _same_detections(host, dev.boxes, dev.scores, dev.class_ids, iou=0.999, score_tol=1e-4)
    t = torch_p(bgr)
    _same_detections(host, t.boxes, t.scores, t.class_ids, iou=0.98, score_tol=5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["depth", "yolo12n"])
def test_torch_cuda_graph_replays_the_same_result(model, tmp_path, cache):
    if not _cuda():
        pytest.skip("needs a CUDA GPU")
    import torch

    import enginekit
    from conftest import varied_depth_weights

    kw = dict(random_init=True)
    if model == "depth":  # every layer at PyTorch's default init: a depth map that varies
        kw = dict(weights=varied_depth_weights(tmp_path))
    plain = enginekit.load(model, backend="torch", cuda_graph=False, conf=1e-4, cache=cache, **kw)
    graphed = enginekit.load(model, backend="torch", cuda_graph=True, conf=1e-4, cache=cache, **kw)
    x = torch.rand((1, 3, 518, 700) if model == "depth" else (1, 3, 640, 640), device="cuda")
    with torch.inference_mode():
        a = next(iter(plain.session(x).values())).clone()
        for _ in range(3):
            b = next(iter(graphed.session(x).values())).clone()
    assert a.std() > 0
    assert (torch.linalg.norm(a - b) / torch.linalg.norm(a)).item() < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["yolo12n", "depth"])
def test_captured_preprocessing_gives_what_eager_preprocessing_gives(model, cache):
    """The predictor replays its GPU preprocessing from a CUDA graph per frame shape: each new frame of the
    same shape must be preprocessed afresh (not the captured frame again), equal to the eager path."""
    if not _cuda():
        pytest.skip("needs a CUDA GPU")
    import cv2
    import torch

    import enginekit

    kw = dict(conf=1e-4) if model == "yolo12n" else dict(input_size=252)
    predictor = enginekit.load(model, random_init=True, backend="torch", cuda_graph=False, cache=cache, **kw)
    assert predictor.graph_preprocess
    bus = cv2.imread(str(_bus()))
    frames = [bus, np.ascontiguousarray(bus[:, ::-1]), np.ascontiguousarray(bus[::-1])]
    device = torch.device(predictor.device)
    hw = predictor.processor.input_hw(bus.shape[:2])
    with torch.cuda.stream(predictor.stream), torch.inference_mode():
        replayed = []
        uploaded = [torch.from_numpy(np.ascontiguousarray(h)).to(device) for h in predictor.host_frames(frames, hw)]
        for t in uploaded:  # the first frame captures, the next two replay
            x, fixed = predictor._preprocess_gpu([t], hw, False, device)
            assert fixed  # a replayed graph's own output
            replayed.append(x.clone())
        predictor.graph_preprocess = False
        eager = [predictor._preprocess_gpu([t.clone()], hw, False, device)[0] for t in uploaded]
    torch.cuda.synchronize()
    captured = list(predictor._pre_graphs.values())
    assert len(captured) == 1 and captured[0] is not False  # captured once, replayed for the same shape
    assert (replayed[1] - replayed[0]).abs().max().item() > 0.1  # different frames, different inputs
    for r, e in zip(replayed, eager):
        assert torch.equal(r, e)
    predictor.graph_preprocess = True  # whole frames through predict: the same results either way
    with_graph = predictor(frames[1])
    predictor.graph_preprocess = False
    without = predictor(frames[1])
    if model == "yolo12n":
        assert len(with_graph.scores) > 0
        assert np.array_equal(with_graph.boxes, without.boxes) and np.array_equal(with_graph.scores, without.scores)
    else:
        assert np.array_equal(with_graph.depth, without.depth)


@pytest.mark.gpu
def test_device_input_after_predicting_outside_inference_mode(cache):
    """``device_input`` after the predictor ran (its preprocessing graph captured in inference mode): called from
    plain code, it gives the frame's input (a copy: the next replay does not rewrite it), not an error about
    inference tensors."""
    if not _cuda():
        pytest.skip("needs a CUDA GPU")
    import cv2
    import torch

    import enginekit

    predictor = enginekit.load("depth", random_init=True, backend="torch", cuda_graph=False, input_size=252,
                               cache=cache)
    bus = cv2.imread(str(_bus()))
    flipped = np.ascontiguousarray(bus[:, ::-1])
    hw = predictor.processor.input_hw(bus.shape[:2])
    predictor(bus)
    predictor(bus)  # captured, then replayed
    assert not torch.is_inference_mode_enabled()
    first = predictor.device_input([bus], hw)
    second = predictor.device_input([flipped], hw)
    torch.cuda.synchronize()
    assert (first - second).abs().max().item() > 0.1  # the first is not rewritten by the second's replay
    want = predictor.device_input([bus], hw, device="cpu")
    assert (first.cpu() - want).abs().max().item() < 1e-2
