"""verify --data: graphs scored against a dataset's labels by Ultralytics' validator metrics.

Oracle: Ultralytics' own ``YOLO(pt).val(data=..., batch=1)`` at its defaults (``rect=True``: each image padded
into its rectangle, stride-aligned plus half a stride) on the suite's trained models and labelled splits drawn
like their training data, non-square as users' photographs are, for every instance task: enginekit's FP32
figures are the validator's to rounding. A graph of one size scores as ``YOLO(file).val()`` (``rect=False``).
A tampered graph loses mAP against the labels and its drop gate fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

SIZE = 320  # the graph's export size: 4x cheaper than 640, still a size the detector was not trained at


def _write_split(root: Path, shapes, seed: int, backgrounds: int = 0) -> Path:
    """``shapes`` labelled images, then ``backgrounds`` images with nothing on them and an empty label file (as
    datasets hold them: negatives)."""
    import cv2

    from trained_detector import NAMES, draw_image

    rng = np.random.default_rng(seed)
    for sub in ("images/val", "labels/val"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i, (h, w) in enumerate(shapes):
        img, boxes = draw_image(rng, h, w, (2, 6), (24, 90))
        cv2.imwrite(str(root / "images/val" / f"{i:03d}.png"), img[..., ::-1])
        (root / "labels/val" / f"{i:03d}.txt").write_text("".join(
            f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}\n"
            for c, x1, y1, x2, y2 in boxes))
    for i in range(len(shapes), len(shapes) + backgrounds):
        h, w = shapes[-1]
        cv2.imwrite(str(root / "images/val" / f"{i:03d}.png"), rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        (root / "labels/val" / f"{i:03d}.txt").write_text("")
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES))
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames:\n{names}")
    return root / "data.yaml"


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("labelled")
    square = _write_split(root / "square", [(SIZE, SIZE)] * 8, seed=31, backgrounds=1)
    rect = _write_split(root / "rect", [(240, 320), (320, 180), (300, 400), (400, 300)] * 3, seed=32)
    return {"square": square, "rect": rect}


@pytest.fixture(scope="module")
def graph(trained_detector, tmp_path_factory, cache):
    from enginekit import api

    out = tmp_path_factory.mktemp("gt-graph")
    return api.export(trained_detector.model, weights=trained_detector.weights, input=f"1x3x{SIZE}x{SIZE}",
                      output=out / "detector.onnx", cache=cache, quiet=True).output


def _val(weights, data, **kw) -> dict:
    from ultralytics import YOLO

    r = YOLO(str(weights)).val(data=str(data), batch=1, imgsz=SIZE, device="cpu", plots=False, verbose=False,
                               workers=0, save_json=False, project=str(Path(data).parent / "runs"), **kw)
    names = {"precision": "precision", "recall": "recall", "mAP50": "map50", "mAP50-95": "map50_95"}
    return {names[k[8:-3]]: float(v) for k, v in r.results_dict.items() if k.startswith("metrics/")}


def _verify(graph, weights, data, cache, tmp_path, **kw):
    from enginekit import api

    kw.setdefault("image_count", 4)
    return api.verify(str(graph), reference=weights, data=data, cache=cache, quiet=True,
                      report_dir=tmp_path / "report", **kw)


def test_fp32_figures_are_ultralytics_val(graph, trained_detector, splits, cache, tmp_path):
    outcome = _verify(graph, trained_detector.weights, splits["square"], cache, tmp_path)
    (report,) = outcome.reports
    art = report.artifacts[-1]
    gt = art.ground_truth
    ref = gt["reference"]
    assert 0.2 < ref["map50_95"] < 0.98, ref  # labels the detector gets partly right: a figure that could differ
    assert ref["images"] == 9 and ref["instances"] > 16  # the background image scores too
    want = _val(trained_detector.weights, splits["square"])  # its defaults: rect=True (320 -> 352x352)
    assert gt["letterbox"] == ref["letterbox"] == "val rect" and gt["rectangles"] == 9
    for key in ("map50_95", "map50", "precision", "recall"):
        assert ref[key] == pytest.approx(want[key], abs=1e-3), (key, ref, want)
        assert gt[key] == pytest.approx(ref[key], abs=2e-3)  # the FP32 graph scores as its PyTorch model
    assert outcome.passed, [str(c) for c in report.failures()]
    assert any(c.name == "labels map50_95 drop" and c.passed for c in art.checks)
    # with --data and no --images the gates judge on the labelled split's own images, not the embedded ones
    photos = {c["input"].split()[1] for c in art.cases if c["input"].startswith("photo ")}
    assert photos and photos <= {p.name for p in (splits["square"].parent / "images/val").iterdir()}, photos
    # the report and the ladder carry them
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["entries"][0]["artifacts"][-1]["ground_truth"]["map50_95"] == pytest.approx(gt["map50_95"])
    assert [r["artifact"] for r in outcome.ladder] == ["PyTorch", art.name]
    assert [r["artifact"] for r in data["ladder"]] == ["PyTorch", art.name]
    assert "## Against the labels of" in (tmp_path / "report" / "summary.md").read_text()
    assert outcome.ladder[0]["value"] == pytest.approx(ref["map50_95"])


def test_non_square_images_score_as_val(graph, trained_detector, splits, cache, tmp_path):
    """A graph fixed at the square takes each image squared, as ``YOLO(file).val()`` (``rect=False``) does: the
    same figures. The graph that takes any H x W takes each image's validator rectangle, as ``YOLO(pt).val()``:
    the same figures again, where the runtime's own rectangle (``YOLO(pt).predict``'s) gave 0.0087 less."""
    import onnx

    model = onnx.load(str(graph))
    for d in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.ClearField("dim_param")
        d.dim_value = SIZE
    fixed = tmp_path / "fixed.onnx"
    onnx.save(model, str(fixed))
    square = _verify(fixed, trained_detector.weights, splits["rect"], cache, tmp_path).reports[0].artifacts[-1]
    assert square.ground_truth["rectangles"] == 0 and square.ground_truth["letterbox"] == f"{SIZE}x{SIZE}"
    want = _val(trained_detector.weights, splits["rect"], rect=False)
    assert 0.2 < want["map50_95"] < 0.98
    for key in ("map50_95", "map50", "precision", "recall"):
        assert square.ground_truth["reference"][key] == pytest.approx(want[key], abs=1e-3), key
        assert square.ground_truth[key] == pytest.approx(want[key], abs=2e-3), key

    rect = _verify(graph, trained_detector.weights, splits["rect"], cache, tmp_path).reports[0].artifacts[-1]
    assert rect.ground_truth["rectangles"] == 12  # every image at its validator rectangle
    assert rect.ground_truth["letterbox"] == rect.ground_truth["reference"]["letterbox"] == "val rect"
    default = _val(trained_detector.weights, splits["rect"])
    for key in ("map50_95", "map50", "precision", "recall"):
        assert rect.ground_truth["reference"][key] == pytest.approx(default[key], abs=1e-3), key
        assert rect.ground_truth[key] == pytest.approx(default[key], abs=2e-3), key


def test_val_rectangles_are_ultralytics_own():
    """The rectangle each image gets is the one Ultralytics' validator dataset gives it at batch 1 (``rect=True``,
    ``pad=0.5``): a 4:3 photograph 512x672 at 640 (not the predictor's 480x640), a square one 672x672."""
    from enginekit.families.ultralytics.labels import val_rectangles

    shapes = [(1080, 810), (720, 1280), (640, 640), (90, 160), (160, 90), (333, 500)]
    assert val_rectangles(shapes, 640, 32)[:3] == [(672, 512), (384, 672), (672, 672)]
    # against Ultralytics' formula, computed here by hand for each
    for (h, w), got in zip(shapes, val_rectangles(shapes, 640, 32)):
        ar = h / w
        want = [ar, 1] if ar < 1 else [1, 1 / ar] if ar > 1 else [1, 1]
        assert got == tuple(int(np.ceil(v * 640 / 32 + 0.5)) * 32 for v in want), ((h, w), got)


# --------------------------------------------------------------------------- every instance task against yolo val

#: non-square images at the trained size of the suite's task models (160): 3:4, 9:16, 4:3
TASK_SPLIT = [(120, 160), (160, 90), (160, 120)]
#: per task, the validator's metric suffix -> enginekit's key prefix
TASK_METRICS = {"segment": {"B": "", "M": "mask_"}, "pose": {"B": "", "P": "pose_"}, "obb": {"B": ""}}


@pytest.mark.parametrize("task", sorted(TASK_METRICS))
def test_every_instance_task_scores_as_yolo_val(task, tmp_path_factory, cache):
    """Segment, pose and obb (the detector is above): enginekit's FP32 figures on 3 non-square images equal
    ``YOLO(pt).val(data, batch=1)`` at its defaults, within 0.002, and a graph that takes any H x W scores the same."""
    from trained_tasks import MODELS, labelled_split, trained_task_model
    from ultralytics import YOLO

    from enginekit import api

    root = tmp_path_factory.mktemp(f"val-{task}")
    data = labelled_split(root / "data", task, TASK_SPLIT)
    weights = trained_task_model(task)
    graph = api.export(MODELS[task], weights=weights, input="1x3x160x160", output=root / "model.onnx", cache=cache,
                       quiet=True).output
    outcome = api.verify(str(graph), reference=weights, data=data, cache=cache, quiet=True, image_count=3,
                         tolerances=["conf=0.1", "min_detections=0"])
    art = outcome.reports[0].artifacts[-1]
    gt, ref = art.ground_truth, art.ground_truth["reference"]
    assert gt["images"] == 3 and gt["rectangles"] == 3 and gt["letterbox"] == "val rect", gt
    r = YOLO(str(weights)).val(data=str(data), batch=1, imgsz=160, device="cpu", plots=False, verbose=False,
                               workers=0, save_json=False, project=str(root / "runs"))
    want = {f"{TASK_METRICS[task][k[-2]]}{name}": float(v) for k, v in r.results_dict.items() if k.startswith("metrics/")
            for stem, name in (("mAP50-95", "map50_95"), ("mAP50", "map50"), ("precision", "precision"),
                               ("recall", "recall")) if k == f"metrics/{stem}({k[-2]})" and k[-2] in TASK_METRICS[task]}
    assert len(want) == 4 * len(TASK_METRICS[task]), r.results_dict
    headline = {"segment": "mask_map50_95", "pose": "pose_map50_95", "obb": "map50_95"}[task]
    assert 0.05 < want[headline] < 0.99, want  # a figure that could differ
    for key, value in want.items():
        assert ref[key] == pytest.approx(value, abs=2e-3), (key, ref, want)
        assert gt[key] == pytest.approx(ref[key], abs=2e-3), (key, gt, ref)


def test_a_graph_that_loses_map_fails_its_labels_gate(graph, trained_detector, splits, cache, tmp_path):
    import onnx

    model = onnx.load(str(graph))
    # the box branch's left-distance bins at every stride lean to the far bins: every box grows to the left, its
    # IoU with its label falls (a change of the scores alone would keep their ranking, and mAP with it)
    for init in model.graph.initializer:
        if init.name.endswith(tuple(f"cv2.{i}.2.bias" for i in range(3))):
            arr = onnx.numpy_helper.to_array(init).copy()
            arr[:16] += np.linspace(0.0, 3.0, 16, dtype=arr.dtype)
            init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    bad = tmp_path / "tampered.onnx"
    onnx.save(model, str(bad))
    outcome = _verify(bad, trained_detector.weights, splits["square"], cache, tmp_path,
                      tolerances=["gt.map50_95_drop=0.01"])
    art = outcome.reports[0].artifacts[-1]
    drop = art.ground_truth["map50_95_drop"]
    assert drop > 0.01, art.ground_truth
    (check,) = [c for c in art.checks if c.name == "labels map50_95 drop"]
    assert not check.passed and check.limit == 0.01 and check.value == pytest.approx(drop)
    assert not outcome.passed
    row = outcome.ladder[-1]
    assert row["passed"] is False and row["drop"] == pytest.approx(drop)


def test_labels_limits_and_precision_lists_are_checked():
    from enginekit.compare.tolerances import Tolerances
    from enginekit.errors import UsageError
    from enginekit.requests import VerifyRequest

    t = Tolerances.parse(["gt.map50_95_drop=0.02", "int8.gt.map50_drop=0.05"])
    assert t.get("fp16", "map50_95_drop", None, part="gt") == 0.02
    for bad, needle in (("map50_95_drop=0.01", "gt.map50_95_drop"), ("gt.rel_l2=0.1", "against labels"),
                        ("gt.map50_95_drop=2", "map50_95_drop")):
        with pytest.raises(UsageError, match=needle):
            Tolerances.parse([bad])
    r = VerifyRequest(target="yolov8n", precision="fp16,int8")
    assert r.precisions == ["fp16", "int8"]
    assert [b.precision for b in r.build_requests] == ["fp16", "int8"]
    # the calibration flags of a list go to its calibrated precision; the FP16 build takes none of them
    r = VerifyRequest(target="yolov8n", precision="fp16,int8",
                      build_options={"calib_data": "imgs", "calib_count": 16, "exclude": ["/model.22/"]})
    fp16, int8 = r.build_requests
    assert (fp16.precision, fp16.calib_data, fp16.calib_count, fp16.exclude) == ("fp16", None, 8, [])
    assert (int8.precision, str(int8.calib_data), int8.calib_count, int8.exclude) == ("int8", "imgs", 16, ["/model.22/"])
    with pytest.raises(UsageError, match="--calib-data"):  # no calibrated precision in the list: refused
        VerifyRequest(target="yolov8n", precision="fp16,fp32", build_options={"calib_data": "imgs"})
    for bad in ("fp16,fp16", "fp16,int3", ","):
        with pytest.raises(UsageError):
            VerifyRequest(target="yolov8n", precision=bad)


def test_bad_data_is_one_line(run_cli, tmp_path, graph, trained_detector):
    from conftest import assert_one_line_error

    r = run_cli("verify", str(graph), "--reference", str(trained_detector.weights), "--data", "missing.yaml")
    assert_one_line_error(r, 2, "dataset not found")
    (tmp_path / "wrong.yaml").write_text(f"path: {tmp_path}\nval: images\nnames:\n  0: a\n")
    (tmp_path / "images").mkdir()
    r = run_cli("verify", str(graph), "--reference", str(trained_detector.weights), "--data", "wrong.yaml")
    assert_one_line_error(r, 2, "val split of wrong.yaml has no images")
    assert "references" not in r.stderr  # refused before any work
    # images with no labels at all: the reference and every graph would score 0, a pass that checked nothing
    import shutil

    from enginekit.images import embedded_image_paths

    (tmp_path / "bare" / "images" / "val").mkdir(parents=True)
    for photo in embedded_image_paths()[:2]:
        shutil.copy(photo, tmp_path / "bare" / "images" / "val" / photo.name)
    r = run_cli("verify", str(graph), "--reference", str(trained_detector.weights), "--data", "bare")
    assert_one_line_error(r, 2, "holds no labels", "0 instances")


def test_bench_records_give_the_ladder_its_latency(tmp_path):
    from types import SimpleNamespace

    from enginekit.latencies import latency_of, record
    from enginekit.verification.ladder import precision_ladder

    cache = SimpleNamespace(root=tmp_path)
    assert latency_of("onnx:abc", cache) is None  # bench never ran it here: no figure
    record(cache, "cpu", "onnx:abc", "onnxruntime-cpu", 1, 12.5)
    record(cache, "NVIDIA H100 80GB HBM3", "onnx:abc", "onnxruntime-cuda", 1, 1.25)
    record(cache, "cpu", "onnx:abc", "onnxruntime-cpu", 4, 30.0)
    assert latency_of("onnx:abc", cache) == {"p50_ms": 1.25, "backend": "onnxruntime-cuda",
                                             "device": "NVIDIA_H100_80GB_HBM3"}
    art = SimpleNamespace(name="onnx-fp16", precision="fp16", size_bytes=2**21,
                          ground_truth={"map50_95": 0.5, "map50_95_drop": 0.004, "limits": {"map50_95_drop": 0.01},
                                        "identity": "onnx:abc", "reference": {"map50_95": 0.504}})
    report = SimpleNamespace(ground_truth={"headline": "map50_95"}, artifacts=[art], engine_key="k")
    rows = precision_ladder([report, report], lambda identity: latency_of(identity, cache))
    assert [(r["artifact"], r["value"]) for r in rows] == [("PyTorch", 0.504), ("onnx-fp16", 0.5)]  # once each
    assert rows[1]["passed"] is True and rows[1]["size_mb"] == 2.0 and rows[1]["latency_ms"]["p50_ms"] == 1.25


@pytest.mark.gpu
def test_engines_are_scored_against_the_labels_on_the_gpu(trained_detector, splits, cache, tmp_path):
    """Where a GPU runs the engine: FP16 and INT8 engines scored against the labels beside their graphs, one
    ladder row each, each drop within its default limit (FP16 0.01, INT8 0.03: the suite's detector)."""
    from enginekit import api
    from enginekit.errors import CapabilityError

    try:
        outcome = api.verify(trained_detector.model, precision="fp16,int8", data=splits["rect"], cache=cache,
                             quiet=True, image_count=1, report_dir=tmp_path / "report",
                             build_options={"weights": trained_detector.weights, "profiles": [f"1x3x{SIZE}x{SIZE}"],
                                            "calib_data": str(splits["square"]), "calib_count": 8})
    except CapabilityError as exc:  # no TensorRT builder installed: no engine to score
        pytest.skip(str(exc))
    engines = [a for r in outcome.reports for a in r.artifacts if a.kind == "engine"]
    idle = [a.reason for a in engines if not a.ran]
    if idle:  # built, but this GPU cannot run it (TensorRT-RTX refuses compute capability 9.0)
        pytest.skip(f"the engines cannot run here: {idle[0]}")
    assert [a.precision for a in engines] == ["fp16", "int8"] and all(a.ran for a in engines)
    for art in engines:
        gt = art.ground_truth
        assert gt["images"] == 12 and 0.2 < gt["reference"]["map50_95"] < 0.98
        assert gt["map50_95_drop"] <= {"fp16": 0.01, "int8": 0.03}[art.precision], gt
    assert {(r["precision"], r["artifact"]) for r in outcome.ladder} >= {("fp16", "engine"), ("int8", "engine")}
