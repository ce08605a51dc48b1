"""``--nms`` for segment, pose and obb models (Ultralytics' ``nms=True`` wrapper keeps each instance's
mask coefficients, keypoints or angle beside its box, score and class), on the suite's trained models.

The graph's kept instances are the ones Ultralytics' own ``non_max_suppression`` keeps on the plain
graph's output; the runtime reads them as a one-to-one head's. Boxes are suppressed by greedy NMS
in ordinary operators (rotated boxes by Ultralytics' fast NMS, as its predict does), which
TensorRT-RTX builds.
"""

from __future__ import annotations

import numpy as np
import pytest


NAMES = {"segment": "yolo11n-seg", "pose": "yolo11n-pose", "obb": "yolo11n-obb"}
SIZE = 160  # the size the models were trained at


@pytest.fixture(scope="module")
def task_graphs(cache, tmp_path_factory):
    """task -> (checkpoint, plain FP32 graph, --nms FP32 graph, 16 held-out images): exported on first use."""
    from trained_tasks import held_out_images, trained_task_model

    from enginekit import api

    root = tmp_path_factory.mktemp("nms-tasks")
    made: dict = {}

    def get(task: str):
        if task not in made:
            weights = trained_task_model(task)
            common = dict(weights=weights, input=f"1x3x{SIZE}x{SIZE}", cache=cache, quiet=True)
            plain = api.export(NAMES[task], output=root / f"{task}.onnx", **common).output
            nms = api.export(NAMES[task], nms=True, output=root / f"{task}.nms.onnx", **common).output
            made[task] = (weights, plain, nms, held_out_images(root / f"{task}-images", task, count=16))
        return made[task]

    return get


def _metadata(path) -> dict[str, str]:
    import onnx

    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


@pytest.mark.slow
@pytest.mark.parametrize("task", list(NAMES))
def test_task_nms_graph_keeps_what_ultralytics_nms_keeps(task, task_graphs):
    import ast

    import cv2
    import onnxruntime as ort
    import torch
    from ultralytics.utils.nms import non_max_suppression

    from enginekit.families import resolve

    _, plain, nms, images = task_graphs(task)
    meta = _metadata(nms)
    assert meta["nms"] == "True" and meta["end2end"] == "True" and meta["nms_conf"] == "0.25"
    nc = len(ast.literal_eval(meta["names"]))
    adapter = resolve(NAMES[task])
    run = {p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (plain, nms)}
    total = 0
    for path in sorted(images.iterdir()):
        x = adapter.preprocess(cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB), (SIZE, SIZE))
        out_plain, out_nms = run[plain].run(None, {"images": x}), run[nms].run(None, {"images": x})
        kept = out_nms[0][0]
        kept = kept[kept[:, 4] > 0]
        kept = kept[np.argsort(-kept[:, 4], kind="stable")]
        (ref,) = non_max_suppression(torch.from_numpy(out_plain[0]), 0.25, 0.7, max_det=300, nc=nc,
                                     rotated=task == "obb", max_time_img=1e6)
        ref = ref.numpy()
        assert kept.shape == ref.shape, (path.name, kept.shape, ref.shape)
        np.testing.assert_allclose(kept, ref, atol=1e-3, err_msg=path.name)  # boxes, score, class, task channels
        if task == "segment":  # the prototypes pass through untouched
            np.testing.assert_allclose(out_nms[1], out_plain[1], atol=1e-5)
        total += len(kept)
    assert total >= 4, f"the trained {task} model kept {total} instances on 16 images: too few to compare"


@pytest.mark.slow
def test_segment_nms_graph_predicts_what_the_plain_graph_predicts(task_graphs):
    """The runtime takes the NMS graph's rows as a one-to-one head's: the same instances and masks."""
    import enginekit

    _, plain, nms, images = task_graphs("segment")
    a = enginekit.load(str(plain), backend="onnxruntime-cpu")
    b = enginekit.load(str(nms), backend="onnxruntime-cpu")
    compared = 0
    for path in sorted(images.iterdir()):
        ra, rb = a(path), b(path)
        assert len(ra) == len(rb), path.name
        if len(ra):
            order_a, order_b = np.argsort(-ra.scores, kind="stable"), np.argsort(-rb.scores, kind="stable")
            np.testing.assert_allclose(ra.boxes[order_a], rb.boxes[order_b], atol=1e-2)
            assert (ra.masks[order_a] == rb.masks[order_b]).mean() > 0.999
        compared += len(ra)
    assert compared >= 4


@pytest.mark.slow
# row width: box, score, class + 32 mask coefficients | 3 keypoints x (x, y, visibility) | angle
@pytest.mark.parametrize("task, width", [("segment", 38), ("pose", 15), ("obb", 7)])
def test_nms_graph_builds_with_tensorrt_rtx(task_graphs, cache, task, width):
    """No NonMaxSuppression node: TensorRT-RTX (whose builder has no NMS layer) builds the graph."""
    pytest.importorskip("tensorrt_rtx")
    import onnx

    from enginekit import api

    weights, _, nms, _ = task_graphs(task)
    ops = {n.op_type for n in onnx.load(str(nms)).graph.node}
    assert "NonMaxSuppression" not in ops and "TopK" in ops
    assert ("Loop" in ops) == (task != "obb")  # greedy NMS settles in a loop; obb's Fast-NMS is one pass
    outcome = api.build(NAMES[task], weights=weights, nms=True, backend="tensorrt-rtx",
                        profiles=[f"1x3x{SIZE}x{SIZE}"], cache=cache, quiet=True)
    outputs = [t for t in outcome.manifest["io"] if t["mode"] == "output"]
    assert [t["shape"][1:] for t in outputs][0] == [300, width]
