"""verify's pictures of every task that has one: boxes (detect, RT-DETR, segment, pose, obb), class maps
(semantic), depth error (Depth-Anything, YOLO depth).

Each picture is drawn from the family's own decoding of its outputs (``picture_boxes``, ``picture_map``)
and must show a difference where the candidate differs and none where it equals the reference. The
instance and dense tasks use the suite's trained models (tests/trained_tasks.py: PyTorch outputs on one
held-out image, no export); RT-DETR uses rows made by hand, whose decoding to pixels is exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from enginekit.families import resolve
from enginekit.verification.pictures import CANDIDATE_BGR, REFERENCE_BGR, TITLE_H, draw_picture

PNG = b"\x89PNG\r\n\x1a\n"


def _read(path):
    import cv2

    assert path is not None and path.read_bytes()[:8] == PNG
    return cv2.imread(str(path))[TITLE_H:]  # the panels, below the title strip


def _candidate_only(picture) -> int:
    """Red (candidate) pixels that no green (reference) box line runs beside: boxes the reference lacks."""
    import cv2

    green = np.all(picture == REFERENCE_BGR, axis=2).astype(np.uint8)
    red = np.all(picture == CANDIDATE_BGR, axis=2)
    near_green = cv2.dilate(green, np.ones((5, 5), np.uint8)) > 0
    return int((red & ~near_green).sum())


def _panels(picture, n=3):
    w = picture.shape[1] // n
    return [picture[:, i * w:(i + 1) * w] for i in range(n)]


@pytest.fixture(scope="module")
def task_outputs(tmp_path_factory):
    """task -> (adapter, a held-out image as the model's input (3, H, W), PyTorch outputs, metadata)."""
    from trained_tasks import MODELS, _settings, draw_image, trained_task_model

    done = {}

    def get(task):
        if task not in done:
            adapter = resolve(MODELS[task])
            loaded = adapter.load(trained_task_model(task), random_init=False, seed=0)
            data = _settings(task)[0]
            rgb = draw_image(np.random.default_rng(10_001), data["size"], (3, 4), data["side_px"])[0]
            batch = adapter.preprocess(rgb, (data["size"], data["size"]))
            done[task] = adapter, batch[0], adapter.reference(loaded, batch), adapter.onnx_metadata(loaded)
        return done[task]

    return get


def test_rtdetr_boxes_decode_to_input_pixels_and_the_overlay_shows_a_moved_box(tmp_path):
    """RT-DETR's rows (cx, cy, w, h in 0..1, score, class) are drawn as corners in the input's pixels,
    by the task metrics' decoding; rows under conf are not drawn."""
    adapter = resolve("rtdetr-l")
    assert adapter.picture_kind == "detections"
    out = np.zeros((1, 300, 6), np.float32)
    out[0, 0] = [0.5, 0.5, 0.2, 0.4, 0.9, 2]
    out[0, 1] = [0.25, 0.75, 0.1, 0.1, 0.6, 0]
    out[0, 2] = [0.7, 0.3, 0.2, 0.2, 0.1, 1]  # under conf 0.25
    boxes = adapter.picture_boxes({"output0": out}, {"end2end": "True"}, (320, 640), 0.25)
    np.testing.assert_allclose(boxes, [[256, 96, 384, 224], [128, 224, 192, 256]], atol=1e-4)

    image = np.full((3, 320, 640), 0.5, np.float32)
    same = draw_picture(adapter, image, {"output0": out}, {"output0": out.copy()}, {"end2end": "True"},
                        tmp_path / "same")
    moved = out.copy()
    moved[0, 1, 0] += 0.1
    differs = draw_picture(adapter, image, {"output0": out}, {"output0": moved}, {"end2end": "True"},
                           tmp_path / "moved")
    assert same.name == "same-detections.png" and differs.name == "moved-detections.png"
    assert _candidate_only(_read(same)) == 0 and _candidate_only(_read(differs)) > 50


@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_instance_boxes_overlay_shows_shifted_candidates(task, task_outputs, tmp_path):
    """Segment and pose draw their instances' boxes, obb its rotated boxes: the reference's and the candidate's
    coincide for an identical candidate, and boxes the candidate moved show apart from the reference's."""
    adapter, image, ref, meta = task_outputs(task)
    assert adapter.picture_kind == "detections"
    boxes = adapter.picture_boxes(ref, meta, image.shape[1:], 0.25)
    assert len(boxes) >= 1 and boxes.shape[1] == (5 if task == "obb" else 4), boxes
    plain = np.full_like(image, 0.5)  # a grey input: no pixel of it has a box's colour
    same = draw_picture(adapter, plain, ref, {k: v.copy() for k, v in ref.items()}, meta, tmp_path / "same")
    shifted = {k: v.copy() for k, v in ref.items()}
    shifted["output0"][:, 0] += 12  # every box (centre x, pixels) 12 px to the right
    differs = draw_picture(adapter, plain, ref, shifted, meta, tmp_path / "shifted")
    assert _candidate_only(_read(same)) == 0
    assert _candidate_only(_read(differs)) > 20 * len(boxes)


def test_every_picture_kind_a_family_may_declare_has_a_drawing():
    """Registration refuses a family whose ``picture_kind`` is not one of ``PICTURE_KINDS`` (or that has no
    boxes or map to draw it from: tests/test_family_interface.py); each of those kinds is drawn here."""
    from enginekit.families.interface import PICTURE_KINDS
    from enginekit.verification.pictures import PICTURES

    assert set(PICTURE_KINDS) == set(PICTURES)


def test_classify_draws_no_picture(tmp_path):
    assert resolve("yolo11n-cls").picture_kind is None
    assert draw_picture(resolve("yolo11n-cls"), np.zeros((3, 8, 8), np.float32), {}, {}, {}, tmp_path / "x") is None


def test_semantic_picture_marks_the_pixels_whose_class_differs(task_outputs, tmp_path):
    adapter, image, ref, meta = task_outputs("semantic")
    assert adapter.picture_kind == "semantic"
    classes = adapter.picture_map(ref, meta)
    assert classes.shape == image.shape[1:] and len(np.unique(classes)) >= 2
    same = draw_picture(adapter, image, ref, {"output0": ref["output0"].copy()}, meta, tmp_path / "same")
    assert same.name == "same-classes.png"
    flipped = ref["output0"].copy()
    flipped[:, :, :32, :32] = flipped[:, ::-1, :32, :32]  # the top-left corner's scores reversed over classes
    changed = int((adapter.picture_map({"output0": flipped}, meta) != classes).sum())
    assert changed > 0
    differs = draw_picture(adapter, image, ref, {"output0": flipped}, meta, tmp_path / "flipped")
    ref_panel, cand_panel, diff = _panels(_read(same))
    assert not diff.any() and np.array_equal(ref_panel, cand_panel)
    ref_panel, cand_panel, diff = _panels(_read(differs))
    k = diff.shape[0] // image.shape[1]  # small inputs are enlarged by a whole factor
    assert int(diff[..., 0].astype(bool).sum()) == changed * k * k
    assert diff[: 32 * k, : 32 * k].any() and not diff[32 * k:].any()  # where the scores changed, nowhere else


def _depth_error_panel(path):
    return _panels(_read(path))[2]


@pytest.mark.parametrize("family", ["yolo26n-depth", "depth"])
def test_depth_error_heatmap_shows_where_the_candidate_differs(family, task_outputs, tmp_path):
    """YOLO depth as Depth-Anything: the error panel is one colour (zero error) for an identical candidate and
    lights up where the candidate's depth was changed."""
    if family == "depth":  # Depth-Anything's output (B, H, W): a made-up ramp is enough for the picture
        adapter = resolve(family)
        h = w = 64
        depth = np.linspace(1.0, 5.0, h * w, dtype=np.float32).reshape(1, h, w)
        ref, meta, image = {"depth": depth}, {}, np.full((3, h, w), 0.5, np.float32)
    else:
        adapter, image, ref, meta = task_outputs("depth")
        h, w = image.shape[1:]
    assert adapter.picture_kind == "depth"
    name = adapter.output_names[0]
    assert adapter.picture_map(ref, meta).shape == (h, w)
    same = draw_picture(adapter, image, ref, {name: ref[name].copy()}, meta, tmp_path / "same")
    assert same.name == "same-depth-error.png"
    changed = ref[name].copy()
    changed[..., : h // 4, : w // 4] *= 1.5
    differs = draw_picture(adapter, image, ref, {name: changed}, meta, tmp_path / "changed")
    flat = _depth_error_panel(same)
    assert (flat == flat[0, 0]).all()
    err = _depth_error_panel(differs)
    k = err.shape[0] // h
    hot = np.any(err != flat[0, 0], axis=2)
    assert hot[: h // 4 * k, : w // 4 * k].mean() > 0.9
