"""Postprocessing on device tensors equals the host path's, for every task, on frames of odd sizes.

A session on a GPU hands its processor torch tensors where it stays (NMS, scaling, masks and depth maps computed
there, one copy of what is kept); a session on the CPU hands it NumPy arrays. The same outputs through both give the
same results: boxes, classes, scores, masks, keypoints, rotated boxes, top classes and depth maps (run here with torch
tensors on the CPU, which take the device path's code: the GPU runs the same operations). ``kept_rows``, the
detection NMS the processors use, keeps what Ultralytics' own ``non_max_suppression`` keeps, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

SIZES = [(481, 643), (333, 250), (720, 1280), (97, 401)]  # odd, tall, wide: none square, none stride-aligned


def _frame(task: str, hw, seed):
    """A BGR frame of the shapes the models were trained on, drawn at ``hw`` (shapes scaled to the frame as the
    training images' to theirs)."""
    rng = np.random.default_rng(seed)
    side = max(24, min(hw) // 4)
    if task == "detect":
        from trained_detector import draw_image

        rgb = draw_image(rng, hw[0], hw[1], (3, 5), (side // 2, side))[0]
    elif task == "depth":
        rgb = (rng.random((*hw, 3)) * 255).astype(np.uint8)
    else:
        from trained_tasks import draw_image

        rgb = draw_image(rng, tuple(hw), (2, 4), (side // 2, side))[0]
    return np.ascontiguousarray(rgb[..., ::-1])


@pytest.fixture(scope="module")
def predictors(trained_detector, tmp_path_factory):
    """The suite's trained detector and task models on ONNX Runtime's CPU provider, and Depth-Anything (random)."""
    from trained_tasks import trained_task_model

    import enginekit

    out = {"detect": enginekit.load(str(trained_detector.weights), backend="onnxruntime-cpu", conf=0.05)}
    for task in ("segment", "pose", "obb", "classify"):
        out[task] = enginekit.load(str(trained_task_model(task)), backend="onnxruntime-cpu", conf=0.05)
    out["depth"] = enginekit.load("depth", random_init=True, backend="onnxruntime-cpu", input_size=224)
    return out


def _same(a, b, where):
    for name in ("boxes", "scores", "class_ids", "masks", "keypoints", "depth"):
        x, y = getattr(a, name, None), getattr(b, name, None)
        if x is None and y is None:
            continue
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape, (where, name, x.shape, y.shape)
        if x.dtype == bool or x.dtype.kind in "iu":
            assert (x == y).all(), (where, name)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-4, err_msg=f"{where} {name}")


@pytest.mark.parametrize("task", ["detect", "segment", "pose", "obb", "classify", "depth"])
def test_device_tensors_and_host_arrays_give_the_same_results(predictors, task):
    import torch

    p = predictors[task]
    found = 0
    for i, hw in enumerate(SIZES):
        frame = _frame(task, hw, i)
        net_hw = p.processor.input_hw(hw)
        x = p.preprocess_cpu([frame], net_hw)
        outputs = p.infer_cpu(x)
        host = p.postprocess({k: np.asarray(v) for k, v in outputs.items()}, [hw], net_hw)[0]
        device = p.postprocess({k: torch.from_numpy(np.array(v)) for k, v in outputs.items()}, [hw], net_hw)[0]
        _same(host, device, f"{task} {hw}")
        found += len(getattr(host, "scores", [1]))
        if task == "depth":
            assert device.tensor.shape == tuple(hw) and host.depth.shape == tuple(hw)
    assert found > 0, task  # something compared


def test_kept_rows_keeps_what_ultralytics_keeps():
    """The processors' NMS against Ultralytics' own, on random outputs of every shape the tasks give (classes, mask
    coefficients, keypoints), ties among scores included, batches of one and two."""
    import torch

    from enginekit.families.ultralytics.runtime import kept_rows, ultralytics_nms

    g = torch.Generator().manual_seed(0)
    compared = 0
    for trial in range(24):
        nc, extra = [(1, 0), (3, 32), (80, 0), (2, 51)][trial % 4]
        anchors, batch = [420, 2100, 8400][trial % 3], 1 + trial % 2
        boxes = torch.rand(batch, 4, anchors, generator=g) * torch.tensor([640, 640, 120, 120])[None, :, None]
        scores = torch.rand(batch, nc, anchors, generator=g) ** 6
        if trial % 3 == 0:
            scores = torch.round(scores * 20) / 20  # ties
        pred = torch.cat([boxes, scores, torch.randn(batch, extra, anchors, generator=g)], 1)
        theirs = ultralytics_nms()(pred, 0.25, 0.7, max_det=300, nc=nc, max_time_img=1e6)
        ours = kept_rows(pred, 0.25, 0.7, max_det=300, nc=nc)
        for a, b in zip(theirs, ours):
            assert torch.equal(a, b), trial
            compared += len(a)
    assert compared > 1000


def _crowded(g, batch: int, anchors: int, nc: int, extra: int, *, ties: bool, clusters: int):
    """Raw detector outputs (B, 4 + nc + extra, anchors) whose boxes crowd around a few centres (NMS has work: long
    chains of overlaps), scores spread, or rounded to ties."""
    import torch

    centre = torch.rand(batch, 2, clusters, generator=g) * torch.tensor([600.0, 600.0])[None, :, None] + 20
    pick = torch.randint(0, clusters, (batch, anchors), generator=g)
    xy = torch.gather(centre, 2, pick[:, None, :].expand(-1, 2, -1)) + torch.randn(batch, 2, anchors, generator=g) * 6
    wh = torch.rand(batch, 2, anchors, generator=g) * 50 + 10
    scores = torch.rand(batch, nc, anchors, generator=g) ** 3
    if ties:
        scores = torch.round(scores * 8) / 8
    return torch.cat([xy, wh, scores, torch.randn(batch, extra, anchors, generator=g)], 1)


def test_the_queued_decode_keeps_kept_rows_rows_or_says_it_cannot():
    """The detector's postprocessing queued with no wait (``queued_nms``): where its flags let it answer, its rows are
    ``kept_rows``' scaled to the frame, bit for bit (order, ties, classes, extra columns); where they do not (more
    candidates than its cap, an IoU at the threshold), it says so and the processor asks ``kept_rows``.
    Crowded boxes, ties, 1 to 80 classes, thresholds as users set them, frames of odd sizes."""
    import torch
    from ultralytics.utils.ops import scale_boxes

    from enginekit.families.ultralytics.queued_nms import queue_rows
    from enginekit.families.ultralytics.runtime import kept_rows

    g = torch.Generator().manual_seed(1)
    answered = declined = rows_compared = 0
    for trial in range(60):
        nc, extra = [(1, 0), (3, 32), (80, 0), (2, 51)][trial % 4]
        anchors = [60, 500, 1764, 3024][trial % 4 - 1 if trial % 5 else 0]
        conf, iou = [(0.25, 0.7), (0.5, 0.45), (0.1, 0.5)][trial % 3]
        batch = 1 + trial % 2
        pred = _crowded(g, batch, anchors, nc, extra, ties=trial % 3 == 0, clusters=1 + trial % 17)
        hw, shapes = (224, 384), [SIZES[trial % 4], SIZES[(trial + 1) % 4]][:batch]
        queued = queue_rows(pred, shapes, hw, conf, iou, nc=nc, max_det=300)
        for q, ref, shape in zip(queued, kept_rows(pred, conf, iou, nc=nc, max_det=300), shapes):
            rows = q.rows()
            if rows is None:
                declined += 1
                continue
            ref = ref.clone()
            ref[:, :4] = scale_boxes(hw, ref[:, :4].clone(), shape)
            assert rows.shape == tuple(ref.shape), trial
            assert np.array_equal(rows, ref.numpy()), trial
            answered += 1
            rows_compared += len(rows)
    assert answered >= 40 and rows_compared > 500, (answered, rows_compared)  # it compared something
    assert declined > 0  # and the flags were exercised


def test_the_queued_decode_declines_what_it_could_decide_otherwise():
    """Its flags send an image to ``kept_rows``: more candidates than its cap; no fixed point within its rounds; a kept
    candidate whose IoU with a later one is at the threshold (torchvision's kernel may round it the other way). Equal
    scores it decides itself, as ``kept_rows`` on the CPU: the first in anchor order is kept."""
    import torch

    from enginekit.families.ultralytics.queued_nms import queue_rows
    from enginekit.families.ultralytics.runtime import kept_rows

    g = torch.Generator().manual_seed(2)
    many = _crowded(g, 1, 3000, 3, 0, ties=False, clusters=5)
    assert queue_rows(many, [(480, 640)], (224, 384), 0.05, 0.7, nc=3, cap=256)[0].rows() is None
    assert queue_rows(many, [(480, 640)], (224, 384), 0.05, 0.7, nc=3, cap=3000)[0].rows() is not None
    chain = _crowded(g, 1, 800, 1, 0, ties=False, clusters=1)  # one crowd: long chains of suppression
    assert queue_rows(chain, [(480, 640)], (224, 384), 0.01, 0.3, nc=1, rounds=1)[0].rows() is None
    # two boxes of IoU exactly 0.5 (10x10 and 10x20 sharing 10x10... union 200, inter 100): at threshold 0.5
    pair = torch.zeros(1, 5, 2)
    pair[0, :, 0] = torch.tensor([50.0, 50.0, 10.0, 20.0, 0.9])
    pair[0, :, 1] = torch.tensor([50.0, 45.0, 10.0, 10.0, 0.8])
    assert queue_rows(pair, [(480, 640)], (224, 384), 0.25, 0.5, nc=1)[0].rows() is None
    assert queue_rows(pair, [(480, 640)], (224, 384), 0.25, 0.7, nc=1)[0].rows() is not None
    same = pair.clone()
    same[0, 4, :] = 0.8
    same[0, 1, 1], same[0, 3, 1] = 49.0, 19.0  # IoU 0.9: one of the two is kept, the first
    rows = queue_rows(same, [(224, 384)], (224, 384), 0.25, 0.7, nc=1)[0].rows()
    assert rows is not None and len(rows) == 1 and np.array_equal(rows, kept_rows(same, 0.25, 0.7, nc=1)[0].numpy())
    assert rows[0, 3] - rows[0, 1] == 20.0  # the first anchor's box (10 x 20)


_KERNEL_CHECK = r"""
import sys
import numpy as np, torch
sys.path[:0] = sys.argv[1:3]
from test_device_postprocess import _crowded, SIZES
from enginekit.families.ultralytics import queued_kernels
from enginekit.families.ultralytics.queued_nms import CAP, pack, unpack

assert queued_kernels.interpreted() and queued_kernels.usable(torch.device("cpu"), CAP), queued_kernels._BROKEN
g = torch.Generator().manual_seed(4)
answered = declined = rows = 0
for trial in range(14):
    nc, extra = [(1, 0), (3, 32), (80, 0), (2, 51)][trial % 4]
    anchors = [60, 500, 1764, 3024, 700][trial % 5]
    conf, iou = [(0.25, 0.7), (0.5, 0.45), (0.1, 0.5)][trial % 3]
    pred = _crowded(g, 1, anchors, nc, extra, ties=trial % 3 == 0, clusters=1 + trial % 17)
    shape, width = SIZES[trial % 4], pred.shape[1] - nc + 2
    ops = pack(pred, [shape], (224, 384), conf, iou, nc=nc, kernels=False, rounds=CAP + 1)[0].numpy()
    tri = pack(pred, [shape], (224, 384), conf, iou, nc=nc, kernels=True)[0].numpy()
    a, b = (unpack(v, width, 300, min(CAP, anchors)) for v in (ops, tri))
    assert (a is None) == (b is None), (trial, ops[:4], tri[:4])
    if a is None:
        declined += 1
        continue
    assert np.array_equal(ops[:4], tri[:4]) and np.array_equal(a, b), trial
    answered += 1
    rows += len(a)
# two boxes of IoU exactly 0.5 at threshold 0.5: declined (torchvision decides), answered at 0.7
pair = torch.zeros(1, 5, 2)
pair[0, :, 0] = torch.tensor([50.0, 50.0, 10.0, 20.0, 0.9])
pair[0, :, 1] = torch.tensor([50.0, 45.0, 10.0, 10.0, 0.8])
at = pack(pair, [(480, 640)], (224, 384), 0.25, 0.5, nc=1, kernels=True)[0].numpy()
above = pack(pair, [(480, 640)], (224, 384), 0.25, 0.7, nc=1, kernels=True)[0].numpy()
assert unpack(at, 6, 300, 2) is None and at[3] == 1.0 and unpack(above, 6, 300, 2) is not None
print(answered, declined, rows)
"""


def test_the_triton_kernels_answer_as_the_torch_operations(tmp_path):
    """``queued_kernels`` (the queued decode's suppression and compaction in two Triton kernels, which a CUDA device
    runs; here Triton's interpreter runs them on the CPU) give what ``queue_image``'s torch operations give: the same
    flags and the same kept rows, bit for bit, on crowded boxes, ties, extra columns and odd frame sizes; declined
    where those decline (more candidates than the cap; an IoU at the threshold)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    here = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", _KERNEL_CHECK, str(here), str(here.parent / "src")],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    answered, declined, rows = (int(v) for v in done.stdout.split()[-3:])
    assert answered >= 6 and declined >= 1 and rows > 300, (answered, declined, rows)


def test_the_trained_detectors_queued_results_equal_its_host_results(predictors):
    """The trained detector's outputs on frames of odd sizes: ``queued_decode`` on tensors (the GPU's path, which the
    predictor captures as a CUDA graph, run here eagerly on the CPU) gives the host path's Detections."""
    import torch

    p = predictors["detect"]
    found = 0
    for i, hw in enumerate(SIZES):
        frame = _frame("detect", hw, 10 + i)
        net_hw = p.processor.input_hw(hw)
        outputs = p.infer_cpu(p.preprocess_cpu([frame], net_hw))
        host = p.postprocess({k: np.asarray(v) for k, v in outputs.items()}, [hw], net_hw)[0]
        tensors = {k: torch.from_numpy(np.array(v)) for k, v in outputs.items()}
        spec = p.processor.queued_decode(tensors, [hw], net_hw)
        assert spec is not None and p.processor.queued_decode(outputs, [hw], net_hw) is None  # host arrays: none
        queued = spec.results([t.numpy() for t in spec.run(tensors)], tensors)[0]
        _same(host, queued, f"queued {hw}")
        assert queued.names == host.names
        found += len(host)
    assert found > 0


def test_a_video_source_decodes_into_the_arrays_it_is_lent(tmp_path):
    """``FrameSource.frames_into(take)``: a video's frames after the first are decoded into the arrays ``take``
    lends (pinned buffers in a stream with a model on a GPU), each equal to what a plain read gives."""
    import cv2

    from enginekit.images import write_video
    from enginekit.runtime.sources import open_source

    video = write_video(tmp_path / "v.mp4", 6, (97, 130))
    lent = []

    def take(shape):
        lent.append(np.zeros(shape, np.uint8))
        return lent[-1]

    frames = [f for _, f in open_source(str(video)).frames_into(take)]
    cap = cv2.VideoCapture(str(video))
    plain = [cap.read()[1] for _ in range(6)]
    assert len(frames) == 6 and all(any(f is a for a in lent) for f in frames[1:])
    assert all(np.array_equal(a, b) for a, b in zip(frames, plain))


def test_pinned_frames_come_back_once_their_arrays_are_gone():
    """The stream's pinned pool (a CUDA machine): a buffer is lent again only once every view of it is gone, and a
    lent buffer is recognised as pinned for the upload."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs a CUDA device")
    from enginekit.runtime.pinned import PinnedFrames, pinned_tensor

    pool = PinnedFrames(limit=4)
    a = pool.take((8, 10, 3))
    view = a[1:, :, ::-1]
    address = a.__array_interface__["data"][0]
    assert pinned_tensor(a) is not None and pinned_tensor(view) is None
    del a
    b = pool.take((8, 10, 3))
    assert b.__array_interface__["data"][0] != address  # still held by the view
    del view
    c = pool.take((8, 10, 3))
    assert c.__array_interface__["data"][0] == address and len(pool) == 2
    pool.close()
    assert pinned_tensor(b) is None


def test_a_frame_copied_to_the_device_when_decoded_is_the_frame():
    """A pool with a device copies a lent frame there as soon as it is decoded (``upload``); the predictor's upload
    then takes that copy (``on_device``), equal to the frame; a frame lent again has no copy until uploaded again."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs a CUDA device")
    from enginekit.runtime.pinned import PinnedFrames, on_device

    device = torch.device("cuda", torch.cuda.current_device())
    pool = PinnedFrames(limit=2, device=device)
    a = pool.take((9, 11, 3))
    a[:] = np.arange(a.size, dtype=np.uint8).reshape(a.shape)
    assert on_device(a, device) is None
    pool.upload(a)
    copy = on_device(a, device)
    assert copy is not None and np.array_equal(copy.cpu().numpy(), a)
    address = a.__array_interface__["data"][0]
    del a, copy
    torch.cuda.synchronize()
    b = pool.take((9, 11, 3))
    assert b.__array_interface__["data"][0] == address and on_device(b, device) is None
    pool.close()


def test_the_kernels_box_scaling_is_ultralytics_own_or_declined(monkeypatch):
    """``queued_nms.box_scale`` gives what the installed Ultralytics' ``scale_boxes`` subtracts, divides by and clips
    to (the queued kernels apply it), and None where ``scale_boxes`` computes otherwise (an older release's single
    gain): the decode then scales with that function itself."""
    import ultralytics.utils.ops as ops

    from enginekit.families.ultralytics import queued_nms

    monkeypatch.setattr(queued_nms, "_SCALES", {})
    for hw, frame in (((224, 384), (1080, 1920)), ((640, 480), (810, 1080)), ((384, 384), (720, 1281)),
                      ((160, 160), (33, 47))):
        scale = queued_nms.box_scale(hw, frame)
        assert scale is not None, (hw, frame)
        pad_x, pad_y, gain_x, gain_y, w, h = scale
        assert (w, h) == (frame[1], frame[0]) and 0 <= pad_x < hw[1] and 0 <= pad_y < hw[0]
    real = ops.scale_boxes

    def single_gain(img1_shape, boxes, img0_shape, ratio_pad=None, padding=True, xywh=False):
        gain = min(img1_shape[0] / img0_shape[0], img1_shape[1] / img0_shape[1])
        pad = (img1_shape[1] - img0_shape[1] * gain) / 2, (img1_shape[0] - img0_shape[0] * gain) / 2
        return real(img1_shape, boxes, img0_shape, ratio_pad=((gain, gain), pad), padding=padding, xywh=xywh)

    monkeypatch.setattr(ops, "scale_boxes", single_gain)
    monkeypatch.setattr(queued_nms, "_SCALES", {})
    assert queued_nms.box_scale((160, 160), (33, 47)) is None  # 112.34 rows: the sides rounded or not
