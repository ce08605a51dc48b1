"""enginekit.load() and enginekit predict for segment, pose, obb and classify.

Oracle: Ultralytics' own ``YOLO(weights).predict`` on the suite's trained task models (tests/trained_tasks.py,
cached outside the checkout), against their FP32 ONNX export run through ``enginekit.load`` on ONNX Runtime's
CPU provider, on held-out images and on enlarged, non-square copies of them (so the letterbox is undone
with both a scale and a padding).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error

# task -> (input side the graph is exported at: the size the model was trained at, predict confidence: the
# small pose and obb models score their shapes lower than 0.25 after 12 epochs)
TASKS = {"segment": (160, 0.25), "pose": (160, 0.1), "obb": (160, 0.1), "classify": (96, None),
         "semantic": (128, None), "depth": (128, None)}
FAMILIES = {"segment": "yolo-seg", "pose": "yolo-pose", "obb": "yolo-obb", "classify": "yolo-cls",
            "semantic": "yolo-sem", "depth": "yolo-depth"}


def _box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(br - tl, 0, None).prod(-1)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None] - inter + 1e-9)


def _rotated_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    import torch
    from ultralytics.utils.metrics import batch_probiou

    return batch_probiou(torch.from_numpy(a.astype(np.float32)), torch.from_numpy(b.astype(np.float32))).numpy()


def _match(ours_boxes, ref_boxes, ours_scores, ref_scores, ours_cls, ref_cls, iou_fn) -> np.ndarray:
    """Index of each of our detections in the reference's; asserts boxes, classes and scores agree."""
    assert len(ours_scores) == len(ref_scores), (len(ours_scores), len(ref_scores))
    m = iou_fn(ours_boxes, ref_boxes)
    j = m.argmax(1)
    assert len(set(j.tolist())) == len(j), "two of our detections match one of the reference's"
    assert m.max(1).min() >= 0.99, m.max(1)
    assert (ours_cls == ref_cls[j]).all()
    assert np.abs(ours_scores - ref_scores[j]).max() <= 1e-3
    return j


def _mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.logical_and(a, b).sum() / max(np.logical_or(a, b).sum(), 1))


@pytest.fixture(scope="module")
def task_images(tmp_path_factory):
    """Per task: 4 held-out images (the size the model was trained at) and each enlarged 2x and cropped to 3:4."""
    import cv2
    from trained_tasks import held_out_images

    root = tmp_path_factory.mktemp("task-images")
    out = {}
    for task, (size, _) in TASKS.items():
        folder = held_out_images(root / task, task, count=4)
        for p in sorted(folder.iterdir()):
            big = cv2.resize(cv2.imread(str(p)), (2 * size, 2 * size), interpolation=cv2.INTER_LINEAR)
            cv2.imwrite(str(p.with_name(p.stem + "-wide.png")), big[size // 4: 2 * size - size // 4])
        out[task] = sorted(folder.iterdir())
    return out


@pytest.fixture(scope="module")
def task_onnx(tmp_path_factory, cache):
    """task -> (checkpoint, its FP32 ONNX export at the trained size): exported once per task, on first use."""
    from trained_tasks import MODELS, trained_task_model

    from enginekit import api

    root = tmp_path_factory.mktemp("task-onnx")
    made: dict[str, tuple[Path, Path]] = {}

    def get(task: str) -> tuple[Path, Path]:
        if task not in made:
            weights, size = trained_task_model(task), TASKS[task][0]
            out = api.export(MODELS[task], weights=weights, input=f"1x3x{size}x{size}", output=root / f"{task}.onnx",
                             cache=cache, quiet=True)
            made[task] = (weights, out.output)
        return made[task]

    return get


@pytest.mark.parametrize("task", list(TASKS))
def test_onnx_cpu_matches_ultralytics_predict_on_trained_task_model(task, task_onnx, task_images):
    """FP32 ONNX on ORT CPU through load() == Ultralytics' own YOLO(weights).predict, image by image."""
    from ultralytics import YOLO

    import enginekit

    weights, onnx_path = task_onnx(task)
    size, conf = TASKS[task]
    predictor = enginekit.load(str(onnx_path), backend="onnxruntime-cpu", **({"conf": conf} if conf else {}))
    assert predictor.backend == "onnxruntime-cpu" and predictor.family == FAMILIES[task]
    model = YOLO(str(weights), task=task)
    compared = compared_wide = 0
    for image in task_images[task]:
        # segment, pose and obb graphs take any H x W: each image at its smallest 32-aligned rectangle, as the .pt
        # predict letterboxes it; semantic graphs keep a fixed square input (rect=False). retina_masks: masks at
        # the original resolution, as ours
        rect = {} if task in ("segment", "pose", "obb") else {"rect": False}
        ref = model.predict(str(image), imgsz=size, retina_masks=True, verbose=False, device="cpu", **rect,
                            **({"conf": conf} if conf else {}))[0]
        ours = predictor(image)
        json.dumps(ours.to_json())  # the results contract serialises
        if task != "classify":  # the input itself is Ultralytics' predictor's, bit for bit, on the host path and
            bgr = __import__("cv2").imread(str(image))  # the GPU path (its device steps run here on the CPU)
            want = model.predictor.preprocess([bgr]).numpy()
            hw = predictor.processor.input_hw(bgr.shape[:2])
            assert np.array_equal(predictor.preprocess_cpu([bgr], hw), want), image.name
            assert np.array_equal(predictor.device_input([bgr], hw, device="cpu").numpy(), want), image.name
        if task == "classify":
            probs = ref.probs.data.numpy()
            assert ours.top1 == int(ref.probs.top1), image.name
            assert np.abs(ours.probabilities - probs).max() <= 1e-3
            assert list(ours.class_ids) == list(ref.probs.top5) and ours.names == [model.names[i] for i in ours.class_ids]
            np.testing.assert_allclose(ours.scores, probs[ours.class_ids], atol=1e-6)
            n = 1
        elif task == "semantic":  # a class per pixel at the original size (letterbox padding removed)
            want = ref.semantic_mask.data.cpu().numpy()
            assert ours.class_map.shape == want.shape == ours.image_shape
            assert (ours.class_map == want).mean() >= 0.999, (ours.class_map == want).mean()
            assert len(np.unique(want)) >= 2  # the map holds shapes, not one class: it compared something
            frame = __import__("cv2").imread(str(image))
            assert ours.plot(frame).shape == frame.shape  # the overlay `predict` saves
            shares = {c["class_id"]: c["share"] for c in ours.to_json()["classes"]}
            assert set(shares) == set(np.unique(want).tolist()) and abs(sum(shares.values()) - 1) < 1e-4
            n = 1
        elif task == "depth":  # the map at the original size (the image stretched to the input, as Ultralytics)
            want = ref.depth.data.cpu().numpy() if hasattr(ref.depth, "data") else ref.depth.cpu().numpy()
            assert ours.depth.shape == want.shape == ours.image_shape
            tol = 1e-3 * float(np.abs(want).max())
            assert np.abs(ours.depth - want).max() <= tol
            # a map that varies by far more than the tolerance: it compared something (the lightly trained model's
            # spread is a few percent of its mean, 0.05 of 3.5 m with one training run)
            assert want.std() > 10 * tol, (want.std(), tol)
            n = 1
        elif task == "obb":
            r = ref.obb
            if len(r):
                j = _match(ours.boxes, r.xywhr.numpy(), ours.scores, r.conf.numpy(), ours.class_ids,
                           r.cls.numpy().astype(int), _rotated_iou)
                assert np.abs(ours.corners - r.xyxyxyxy.numpy()[j]).max() <= 0.5
            n = len(r)
        else:
            r = ref.boxes
            j = _match(ours.boxes, r.xyxy.numpy(), ours.scores, r.conf.numpy(), ours.class_ids,
                       r.cls.numpy().astype(int), _box_iou) if len(r) else np.zeros(0, int)
            if task == "segment" and len(r):
                ref_masks = ref.masks.data.numpy().astype(bool)[j]
                assert ours.masks.shape == ref_masks.shape and ours.masks.shape[1:] == ours.image_shape
                ious = [_mask_iou(a, b) for a, b in zip(ours.masks, ref_masks)]
                assert min(ious) >= 0.95, ious
            if task == "pose" and len(r):
                kp, ref_kp = ours.keypoints, ref.keypoints.data.numpy()[j]
                assert kp.shape == ref_kp.shape
                assert np.abs(kp[..., :2] - ref_kp[..., :2]).max() <= 1.0  # pixels
                assert np.abs(kp[..., 2] - ref_kp[..., 2]).max() <= 1e-3  # visibility
            n = len(r)
        if task not in ("classify", "semantic", "depth"):
            assert len(ours) == n and ours.names == [model.names[int(c)] for c in ours.class_ids]
        compared += n
        compared_wide += n if "wide" in image.name else 0
    assert compared > 0 and compared_wide > 0, f"the trained {task} model found nothing: the check compared nothing"


def test_classify_device_preprocessing_matches_the_host_transforms():
    """The GPU path's classify preprocessing (torch ops, run here on CPU tensors) == classify_transforms on PIL,
    within a grey level: resize of the shorter side (antialiased bilinear), centre crop, 0..1."""
    import cv2
    import torch

    from enginekit.families import resolve
    from enginekit.images import embedded_image_paths
    from enginekit.backends import SessionInfo
    from enginekit.families.ultralytics.runtime import ClassifyProcessor

    bus = next(p for p in embedded_image_paths() if p.name == "bus.jpg")
    rgb = np.ascontiguousarray(cv2.resize(cv2.imread(str(bus)), (405, 540))[..., ::-1])
    processor = ClassifyProcessor(resolve("yolo11n-cls"), {}, SessionInfo("torch", "cpu", "images", ("output0",),
                                                                          (None, 3, 224, 224)))
    host = processor.preprocess_cpu(rgb, (224, 224))
    device = processor.preprocess_gpu(torch.from_numpy(rgb).permute(2, 0, 1).float(), (224, 224)).numpy()
    assert host.shape == device.shape == (3, 224, 224)
    assert np.abs(host - device).max() <= 2 / 255 and np.abs(host - device).mean() <= 0.5 / 255


def test_family_without_runtime_is_refused_before_any_export(monkeypatch):
    import enginekit
    from enginekit.errors import UsageError
    from enginekit.flows import load

    def no_export(*a, **k):
        raise AssertionError("exported a model the runtime cannot run")

    from enginekit.families.ultralytics.yolo import YoloSemanticAdapter

    monkeypatch.setattr(load, "export_onnx", no_export)
    monkeypatch.setattr(YoloSemanticAdapter, "processor", None)  # a family that declares no runtime
    with pytest.raises(UsageError, match="does not run yolo-sem models") as err:
        enginekit.load("yolo26n-sem", random_init=True, backend="onnxruntime-cpu")
    assert "yolo-seg" in str(err.value) and "yolo-cls" in str(err.value)  # it says what it runs


# -- enginekit predict --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    """A real photograph, shrunk (3:4) so the masks of 640x640 models stay small."""
    import cv2

    from enginekit.images import embedded_image_paths

    bus = next(p for p in embedded_image_paths() if p.name == "bus.jpg")
    path = tmp_path_factory.mktemp("task-photo") / "bus-small.png"
    cv2.imwrite(str(path), cv2.resize(cv2.imread(str(bus)), (105, 140), interpolation=cv2.INTER_AREA))
    return path


def _check_segments(result: dict) -> None:
    for d in result["detections"]:
        x1, y1, x2, y2 = d["box"]
        assert d["mask"]["area"] > 0 and len(d["mask"]["polygon"]) >= 3
        xs, ys = np.array(d["mask"]["polygon"]).T
        assert xs.min() >= x1 - 1 and xs.max() <= x2 + 1 and ys.min() >= y1 - 1 and ys.max() <= y2 + 1


def test_predict_segment_random_init_writes_results_and_overlay(run_cli, tmp_path, photo):
    import cv2

    r = run_cli("predict", "yolo11n-seg", str(photo), "--random-init", "--backend", "onnxruntime-cpu",
                "--save", str(tmp_path / "out"))
    assert r.code == 0, r.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["models"][0]["family"] == "yolo-seg"
    result = data["frames"][0]["results"]["yolo11n-seg"]
    assert result["kind"] == "segments" and result["image_shape"] == [140, 105]
    _check_segments(result)  # random weights score every anchor alike (~1e-5): what they keep is arbitrary
    assert cv2.imread(str(tmp_path / "out" / result["overlay"])).shape == (140, 105, 3)


def test_predict_segment_trained_writes_masks_and_overlays(run_cli, tmp_path, task_onnx, task_images):
    import cv2

    _, onnx_path = task_onnx("segment")
    folder = tmp_path / "images"
    folder.mkdir()
    for image in task_images["segment"]:
        (folder / image.name).write_bytes(image.read_bytes())
    r = run_cli("predict", str(onnx_path), str(folder), "--backend", "onnxruntime-cpu", "--save", str(tmp_path / "out"))
    assert r.code == 0, r.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    results = [f["results"]["yolo11n-seg"] for f in data["frames"]]
    assert len(results) == len(task_images["segment"]) and sum(len(r["detections"]) for r in results) > 0
    for result, image in zip(results, sorted(folder.iterdir())):
        _check_segments(result)
        frame = cv2.imread(str(image))
        overlay = cv2.imread(str(tmp_path / "out" / result["overlay"]))
        assert overlay.shape == frame.shape
        if result["detections"]:  # masks and boxes drawn on it
            assert np.abs(overlay.astype(int) - frame.astype(int)).mean() > 1


def test_predict_classify_writes_top5_and_overlay(run_cli, tmp_path, photo):
    r = run_cli("predict", "yolo11n-cls", str(photo), "--random-init", "--backend", "onnxruntime-cpu",
                "--save", str(tmp_path / "out"))
    assert r.code == 0, r.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    result = data["frames"][0]["results"]["yolo11n-cls"]
    assert result["kind"] == "classification"
    top = result["top"]
    scores = [t["score"] for t in top]
    assert len(top) == 5 and scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0 + 1e-4
    assert all(t["name"] for t in top)
    assert (tmp_path / "out" / result["overlay"]).is_file()



def _device_input_is_ultralytics(task: str, weights: Path, predictor, images: list[Path]) -> int:
    """The input the predictor's GPU path makes (on its device, or on the CPU for a CPU session) == Ultralytics'
    predictor's on the same device, bit for bit; returns the images compared."""
    import contextlib

    import cv2
    import torch
    from ultralytics import YOLO

    size = TASKS[task][0]
    device = predictor.device
    on_gpu = device.startswith("cuda")
    model = YOLO(str(weights), task=task)
    rect = {} if task in ("segment", "pose", "obb") else {"rect": False}
    for image in images:
        bgr = cv2.imread(str(image))
        model.predict(bgr, imgsz=size, verbose=False, device=device, **rect)
        want = model.predictor.preprocess([bgr])
        hw = predictor.processor.input_hw(bgr.shape[:2])
        stream = torch.cuda.stream(predictor.stream or torch.cuda.current_stream()) if on_gpu else contextlib.nullcontext()
        with stream, torch.inference_mode():
            got = predictor.device_input([bgr], hw, device=device).clone()
        if on_gpu:
            torch.cuda.synchronize()
        assert got.shape == want.shape and torch.equal(got, want), (task, image.name, (got - want).abs().max().item())
    return len(images)


@pytest.mark.gpu
@pytest.mark.parametrize("task", [t for t in TASKS if t != "classify"])
def test_gpu_input_is_the_ultralytics_predictor_input_on_the_gpu(task, task_onnx, task_images):
    """On a GPU every task's input (letterboxed, or stretched for depth, on the host; the rest on the device) is
    the tensor Ultralytics' predictor builds there (ONNX Runtime CUDA on the graph at the trained size)."""
    import torch

    import enginekit

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    weights, onnx_path = task_onnx(task)
    predictor = enginekit.load(str(onnx_path), backend="onnxruntime-cuda")
    assert predictor.device.startswith("cuda")
    assert _device_input_is_ultralytics(task, weights, predictor, task_images[task]) == 8
