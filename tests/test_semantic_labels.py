"""verify --data for declared PyTorch models: semantic class maps and classify folders against labels.

The model is the user's colour labeller (tests/test_torch_models.py's ColourNet: each pixel's class is the
colour that dominates its 3x3 neighbourhood, 0 red, 1 green, 2 blue), so what it predicts on a drawn scene is
known: labels drawn with the scene's polygons score mIoU ~1 (the polygons' corner pixels aside), the same
labels moved by a few pixels score measurably lower, and a graph with two logits exchanged loses mIoU past
its gate. Scenes are 96x128 (not square), the network's declared size, so no resize blurs the colours.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import assert_one_line_error
from test_torch_models import USER_MODULE, tamper

H, W = 96, 128
FLAGS = {"task": "semantic", "size": f"{H}x{W}", "dynamic": "hw"}
RED, GREEN, BLUE = (0, 0, 255), (0, 255, 0), (255, 0, 0)  # BGR, as OpenCV writes
CLASSIFIER = '''\
"""A classifier as a user keeps it: the image's dominant colour (R, G, B)."""
from torch import nn


def make():
    linear = nn.Linear(3, 3)
    nn.init.eye_(linear.weight)
    linear.weight.data.mul_(10.0)
    nn.init.zeros_(linear.bias)
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), linear)
'''


def _scenes(count: int = 3):
    """Red ground, a green and a blue polygon (the blue one drawn later, over the green where they meet)."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(count):
        x0, y0 = int(rng.integers(8, 40)), int(rng.integers(6, 30))
        green = np.array([[x0, y0], [x0 + 56, y0 + 4], [x0 + 48, y0 + 50], [x0 + 4, y0 + 44]], np.int32)
        x1, y1 = int(rng.integers(50, 80)), int(rng.integers(30, 50))
        blue = np.array([[x1, y1], [x1 + 40, y1 + 8], [x1 + 30, y1 + 40], [x1 - 6, y1 + 30]], np.int32)
        out.append([(0, green), (1, blue)])  # (class among the polygons: 0 green, 1 blue, points x, y)
    return out


def _draw(polygons) -> np.ndarray:
    img = np.zeros((H, W, 3), np.uint8)
    img[:] = RED
    for cls, pts in polygons:
        cv2.fillPoly(img, [pts], GREEN if cls == 0 else BLUE)
    return img


def _polygon_split(root: Path, scenes, shift: int = 0, names=("green", "blue")) -> Path:
    for sub in ("images/val", "labels/val"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i, polygons in enumerate(scenes):
        cv2.imwrite(str(root / "images/val" / f"{i}.png"), _draw(polygons))
        lines = []
        for cls, pts in polygons:
            moved = np.clip(pts + shift, 0, [W - 1, H - 1])
            lines.append(f"{cls} " + " ".join(f"{float(x) / W!r} {float(y) / H!r}" for x, y in moved))
        (root / "labels/val" / f"{i}.txt").write_text("\n".join(lines) + "\n")
    (root / "data.yaml").write_text(f"path: {root}\nval: images/val\nnames: {list(names)}\n")
    return root / "data.yaml"


def _mask_split(root: Path, scenes, size=(H, W)) -> Path:
    """The same scenes with VOC-style masks (values 0 red, 1 green, 2 blue; a 255 border ignored)."""
    for sub in ("images/val", "masks/val"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i, polygons in enumerate(scenes):
        cv2.imwrite(str(root / "images/val" / f"{i}.png"), _draw(polygons))
        mask = np.zeros((H, W), np.uint8)
        for cls, pts in polygons:
            cv2.fillPoly(mask, [pts], cls + 1)
        mask = cv2.resize(mask, size[::-1], interpolation=cv2.INTER_NEAREST)
        cv2.imwrite(str(root / "masks/val" / f"{i}.png"), mask)
    (root / "data.yaml").write_text(f"path: {root}\nval: images/val\nnames: [red, green, blue]\n")
    return root / "data.yaml"


@pytest.fixture(scope="module")
def graphs(tmp_path_factory, cache):
    """The colour labeller's FP32 and FP16 graphs, and the FP32 one with its red and green logits exchanged."""
    from enginekit import api

    folder = tmp_path_factory.mktemp("semantic-labels")
    module = folder / "colours.py"
    module.write_text(USER_MODULE)
    fp32 = api.export(f"{module}:make", declared=FLAGS, output=folder / "colours.onnx", cache=cache, quiet=True)
    fp16 = api.export(f"{module}:make", declared=FLAGS, fp16=True, output=folder / "colours.fp16.onnx", cache=cache,
                      quiet=True)
    assert fp32.passed and fp16.passed
    bad = folder / "colours-tampered.onnx"
    tamper(fp32.output, bad, "head.weight")
    return {"fp32": fp32.output, "fp16": fp16.output, "tampered": bad}


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("semantic-splits")
    scenes = _scenes()
    return {"polygons": _polygon_split(root / "poly", scenes), "masks": _mask_split(root / "masks", scenes),
            "shifted": _polygon_split(root / "shifted", scenes, shift=10)}


def _verify(graph, data, cache, tmp_path, **kw):
    from enginekit import api

    outcome = api.verify(str(graph), data=data, cache=cache, quiet=True, image_count=1,
                         report_dir=tmp_path / "report", **kw)
    return outcome, outcome.reports[0].artifacts[-1]


def test_class_maps_score_against_polygons_and_masks_alike_and_wrong_labels_score_lower(graphs, splits, cache,
                                                                                         tmp_path):
    _, poly = _verify(graphs["fp32"], splits["polygons"], cache, tmp_path)
    ref = poly.ground_truth["reference"]
    # the polygons' corner pixels take their neighbours' colour: all but a few dozen pixels agree
    assert ref["miou"] > 0.98 and ref["pixel_accuracy"] > 0.99 and ref["classes"] == 3, ref
    assert ref["pixels"] == ref["instances"] == 3 * H * W  # unlabelled pixels are the model's class 0 (red)
    assert poly.ground_truth["miou"] == pytest.approx(ref["miou"], abs=1e-9) and poly.passed
    outcome, masks = _verify(graphs["fp32"], splits["masks"], cache, tmp_path)
    for key in ("miou", "pixel_accuracy", "pixels"):  # the same scene as masks: the same figures
        assert masks.ground_truth["reference"][key] == ref[key], key
    assert any("matched by index" in n for n in outcome.reports[0].ground_truth["notes"])
    _, shifted = _verify(graphs["fp32"], splits["shifted"], cache, tmp_path)
    moved = shifted.ground_truth["reference"]
    assert moved["miou"] < ref["miou"] - 0.1 and moved["pixel_accuracy"] < ref["pixel_accuracy"] - 0.05, moved


def test_verify_data_end_to_end_fp32_fp16_and_a_tampered_graph(graphs, splits, run_cli, tmp_path):
    for precision in ("fp32", "fp16"):
        r = run_cli("verify", str(graphs[precision]), "--data", str(splits["polygons"]), "--image-count", "1",
                    "--report", f"rep-{precision}")
        assert r.code == 0, (r.stdout, r.stderr)
        data = json.loads((tmp_path / f"rep-{precision}" / "report.json").read_text())
        entry = data["entries"][0]
        gt = entry["artifacts"][-1]["ground_truth"]
        assert gt["miou"] > 0.98 and gt["miou_drop"] <= gt["limits"]["miou_drop"], gt
        assert gt["limits"]["miou_drop"] == {"fp32": 0.002, "fp16": 0.01}[precision]
        assert entry["ground_truth"]["headline"] == "miou" and entry["ground_truth"]["images"] == 3
        assert "mIoU" in r.stdout + r.stderr and "labelled pixels" in r.stdout + r.stderr
    r = run_cli("verify", str(graphs["tampered"]), "--data", str(splits["polygons"]), "--image-count", "1",
                "--report", "rep-bad")
    assert r.code == 1, (r.stdout, r.stderr)
    entry = json.loads((tmp_path / "rep-bad" / "report.json").read_text())["entries"][0]
    assert entry["artifacts"][-1]["ground_truth"]["miou_drop"] > 0.3  # red and green exchanged
    assert any("labels miou drop" in f for f in entry["failures"]), entry["failures"]


def test_the_drop_gate_decides_and_takes_the_users_limit(graphs, splits, cache, tmp_path):
    outcome, art = _verify(graphs["tampered"], splits["polygons"], cache, tmp_path, tolerances=["gt.miou_drop=0.9"])
    (check,) = [c for c in art.checks if c.name == "labels miou drop"]
    assert check.passed and check.limit == 0.9 and check.value > 0.3  # the same drop, let through by a raised limit
    row = outcome.ladder[-1]
    assert row["metric"] == "miou" and row["passed"] is True


def test_class_mapping_by_name_by_index_and_its_refusals():
    from enginekit.errors import UsageError
    from enginekit.families.torch_models.labels import IGNORE, class_mapping
    from enginekit.families.torch_models.table import class_names

    voc = class_names("voc", 21)
    assert voc[0] == "__background__" and voc[15] == "person"
    m = class_mapping({0: "Person", 1: "dining table", 2: "unicorn"}, voc, None)
    assert m.table == {0: 15, 1: 11} and m.unlabelled == 0 and m.how == "name"  # __background__
    assert "unicorn" in m.notes[0]
    with pytest.raises(UsageError, match="matched by name"):
        class_mapping({0: "unicorn", 1: "dragon"}, voc, None)
    pets = {0: "cat", 1: "dog", 2: "bird"}
    assert class_mapping({0: "dog", 1: "cat"}, pets, None).unlabelled == IGNORE  # class 0 is a dataset class
    m = class_mapping({0: "dog", 1: "cat"}, {0: "void", 1: "cat", 2: "dog"}, None)
    assert m.table == {0: 2, 1: 1} and m.unlabelled == 0  # one class more, class 0 matched none
    assert class_mapping({0: "a", 1: "b"}, {}, None) is None  # the model's count decides: known when it runs
    m = class_mapping({0: "a", 1: "b"}, {}, 3)
    assert m.table == {0: 1, 1: 2} and m.unlabelled == 0 and m.how == "index+1"
    assert class_mapping({0: "a", 1: "b", 2: "c"}, {}, 3).table == {0: 0, 1: 1, 2: 2}
    with pytest.raises(UsageError, match="named nowhere"):
        class_mapping({0: "a", 1: "b"}, {}, 5)


def test_bad_labels_are_one_line(graphs, splits, run_cli, tmp_path, cache):
    scenes = _scenes(2)
    wrong = _mask_split(tmp_path / "wrong-size", scenes, size=(H // 2, W // 2))
    r = run_cli("verify", str(graphs["fp32"]), "--data", str(wrong), "--image-count", "1")
    assert_one_line_error(r, 2, "mask", "at its image's size")
    boxes = tmp_path / "boxes"  # an Ultralytics detect dataset: boxes, no polygon to fill
    (boxes / "images/val").mkdir(parents=True)
    (boxes / "labels/val").mkdir(parents=True)
    cv2.imwrite(str(boxes / "images/val/0.png"), _draw(scenes[0]))
    (boxes / "labels/val/0.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (boxes / "data.yaml").write_text(f"path: {boxes}\nval: images/val\nnames: [green, blue]\n")
    r = run_cli("verify", str(graphs["fp32"]), "--data", str(boxes / "data.yaml"), "--image-count", "1")
    assert_one_line_error(r, 2, "segment dataset")  # Ultralytics' own word on it
    (boxes / "labels/val/0.txt").unlink()  # images and no labels at all
    r = run_cli("verify", str(graphs["fp32"]), "--data", str(boxes / "data.yaml"), "--image-count", "1")
    assert_one_line_error(r, 2, "no usable labels")
    from enginekit.errors import UsageError

    loose = tmp_path / "loose"  # masks in a folder without a YAML: their values are the model's classes (3)
    _mask_split(loose, scenes)
    (loose / "data.yaml").unlink()
    mask = loose / "masks/val/1.png"
    cv2.imwrite(str(mask), np.where(cv2.imread(str(mask), cv2.IMREAD_UNCHANGED) == 2, 5, 0).astype(np.uint8))
    with pytest.raises(UsageError, match="holds value 5, no class of the model"):
        _verify(graphs["fp32"], loose, cache, tmp_path)
    five = _polygon_split(tmp_path / "five", scenes, names=("a", "b", "c", "d", "e"))
    r = run_cli("verify", str(graphs["fp32"]), "--data", str(five), "--image-count", "1")
    assert_one_line_error(r, 2, "named nowhere")


# -- classify ----------------------------------------------------------------------------------------------
def _folders(root: Path, order=("0_red", "1_green", "2_blue")) -> Path:
    """Class folders of flat-colour images (not square), named so their sorted order is R, G, B or ``order``."""
    rng = np.random.default_rng(3)
    for name, colour in zip(order, (RED, GREEN, BLUE)):
        for split in ("train", "val"):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(2):
                img = np.full((40, 72, 3), colour, np.uint8)
                img = np.clip(img.astype(int) + rng.integers(-30, 30, img.shape), 0, 255).astype(np.uint8)
                cv2.imwrite(str(folder / f"{i}.png"), img)
    return root


def test_a_declared_classifier_scores_top1_against_class_folders(tmp_path, cache):
    from enginekit import api

    module = tmp_path / "dominant.py"
    module.write_text(CLASSIFIER)
    graph = api.export(f"{module}:make", declared={"task": "classify", "size": "32x32", "outputs": "logits:logits"},
                       output=tmp_path / "dominant.onnx", cache=cache, quiet=True).output
    _, art = _verify(graph, _folders(tmp_path / "rgb"), cache, tmp_path)
    gt = art.ground_truth
    assert gt["reference"]["top1"] == 1.0 and gt["top1"] == 1.0 and gt["images"] == 6 and art.passed, gt
    # folders in another order: sorted, they name the model's classes otherwise, and top-1 falls
    _, art = _verify(graph, _folders(tmp_path / "brg", order=("1_red", "2_green", "0_blue")), cache, tmp_path)
    assert art.ground_truth["reference"]["top1"] == 0.0


def test_classify_folders_map_to_the_models_class_names(tmp_path):
    from enginekit.datasets import load_dataset
    from enginekit.errors import UsageError
    from enginekit.families.torch_models.labels import read_classify_split
    from enginekit.families.torch_models.table import class_names

    imagenet = class_names("imagenet", 1000)
    root = _folders(tmp_path / "named", order=("goldfish", "Tench", "unicorn"))
    split = read_classify_split(load_dataset(root), "val", imagenet, None, model="resnet18")
    assert {s.path.parent.name: s.class_id for s in split.samples} == {"goldfish": 1, "Tench": 0}
    assert "unicorn" in split.notes[0]
    with pytest.raises(UsageError, match="matched by name"):
        read_classify_split(load_dataset(_folders(tmp_path / "odd", order=("a", "b", "c"))), "val", imagenet, None,
                            model="resnet18")


def test_scores_are_cached_by_the_masks_content(graphs, tmp_path, cache):
    scenes = _scenes(2)
    data = _mask_split(tmp_path / "cached", scenes)
    _, first = _verify(graphs["fp32"], data, cache, tmp_path)
    _, again = _verify(graphs["fp32"], data, cache, tmp_path)
    assert again.ground_truth["reference"] == first.ground_truth["reference"]
    mask = tmp_path / "cached/masks/val/0.png"
    values = cv2.imread(str(mask), cv2.IMREAD_UNCHANGED)
    values[:, : W // 2] = 2  # half the first image now says blue: same images, other labels
    cv2.imwrite(str(mask), values)
    _, changed = _verify(graphs["fp32"], data, cache, tmp_path)
    assert changed.ground_truth["reference"]["miou"] < first.ground_truth["reference"]["miou"] - 0.1


def test_a_torchvision_model_maps_dataset_classes_by_name_or_refuses(tmp_path, run_cli, cache):
    """torchvision's segmentation models name VOC's 21 classes: a dataset's classes are found among them by
    name, pixels under no polygon are its __background__; a dataset naming none of them is refused."""
    from enginekit import api

    graph = api.export("torchvision:lraspp_mobilenet_v3_large", random_init=True, declared={"size": f"{H}x{W}"},
                       output=tmp_path / "lraspp.onnx", cache=cache, quiet=True).output
    scenes = _scenes(2)
    named = _polygon_split(tmp_path / "voc", scenes, names=("Potted Plant", "unicorn"))
    outcome, art = _verify(graph, named, cache, tmp_path)
    notes = outcome.reports[0].ground_truth["notes"]
    assert any("unicorn" in n and "ignored" in n for n in notes), notes
    # pottedplant (16) where the green polygon is, __background__ (0) around: the blue polygon's pixels ignored
    assert art.ground_truth["reference"]["pixels"] < 2 * H * W and "miou" in art.ground_truth
    other = _polygon_split(tmp_path / "none", scenes, names=("unicorn", "dragon"))
    r = run_cli("verify", str(graph), "--data", str(other), "--image-count", "1")
    assert_one_line_error(r, 2, "no class of data.yaml", "matched by name")
