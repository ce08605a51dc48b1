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
