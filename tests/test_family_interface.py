"""Adding a family touches its own module only: one defined outside enginekit (tests/tiny_family.py) is
exported and parity-checked by ``enginekit export``, gated by its task metrics, and run by ``enginekit.load``
through the processor it declares. A class that lacks what a family must declare is refused at registration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    """``enginekit export tiny-colours`` in a fresh process that imports the family's module first (nothing in
    enginekit names it), at a non-square size; its parity report."""
    root = tmp_path_factory.mktemp("tiny")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    code = "import tiny_family; from enginekit.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", code, "export", "tiny-colours", "--random-init", "--input", "1x3x96x128",
                           "--output", str(root / "tiny.onnx"), "--report", str(root / "report.json")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return root / "tiny.onnx", json.loads((root / "report.json").read_text())


def test_a_new_family_exports_and_passes_parity_on_something_to_compare(tiny_onnx):
    path, report = tiny_onnx
    assert path.is_file() and report["passed"]
    (parity,) = report["parity"]
    assert parity["parts"] and "logits" in parity["parts"]
    # the photographs hold all three dominant colours: the task metrics compared real class maps
    assert parity["task"]["compared"] == 3 and parity["task"]["miou"] == 1.0


def test_a_new_family_runs_through_its_own_processor(tiny_onnx):
    import cv2
    import torch

    import enginekit
    import tiny_family
    from enginekit.images import embedded_image_paths
    from enginekit.results import SemanticMap

    bus = next(p for p in embedded_image_paths() if p.name == "bus.jpg")  # 810 x 1080, portrait
    predictor = enginekit.load(str(tiny_onnx[0]), backend="onnxruntime-cpu")
    assert isinstance(predictor.processor, tiny_family.TinyProcessor) and predictor.family == "tiny-colours"
    result = predictor(str(bus))
    assert isinstance(result, SemanticMap) and result.class_map.shape == result.image_shape == (1080, 810)
    # the reference: the family's PyTorch module on its own preprocessing, classes taken back to the image
    rgb = cv2.imread(str(bus))[..., ::-1]
    adapter = enginekit.families.resolve("tiny-colours")
    with torch.inference_mode():
        logits = tiny_family.colour_net(0)(torch.from_numpy(adapter.preprocess(np.ascontiguousarray(rgb), (64, 64))))
    expected = cv2.resize(logits[0].argmax(0).numpy().astype(np.uint8), (810, 1080), interpolation=cv2.INTER_NEAREST)
    assert len(np.unique(expected)) == 3
    assert (result.class_map == expected).mean() > 0.9  # class boundaries move with the logits' bilinear upsampling


def test_a_new_family_gate_fails_a_candidate_that_changes_its_classes():
    import tiny_family  # noqa: F401 - registers the family
    from enginekit.compare.comparison import Case, Gates, compare
    from enginekit.families import resolve

    adapter = resolve("tiny-colours")
    logits = np.zeros((2, 3, 32, 32), np.float32)
    logits[:, 0, :, :16], logits[:, 1, :, 16:], logits[:, 2, 8:24, 8:24] = 3, 3, 6
    cases = [Case(f"photo {i}", "photo", {"images": np.full(1, i, np.float32)}, {"logits": logits[i:i + 1]})
             for i in range(2)]
    swapped = logits[:, [1, 0, 2]]  # red and green exchanged

    def run(feed):
        return {"logits": swapped[int(feed["images"][0]):int(feed["images"][0]) + 1]}

    found = compare(run, cases, adapter=adapter, gates=Gates(adapter, {"rel_l2": 10.0, "cosine": 1e-6}),
                    precision="fp16", name="tiny")
    assert not found.passed and found.task["compared"] == 3 and found.task["miou"] < 0.5
    assert [c.name for c in found.checks if not c.passed] == ["task miou", "task pixel_accuracy"]


def test_registration_names_what_a_family_lacks():
    from enginekit.families import ModelAdapter, register

    class Half(ModelAdapter):
        family = "half"
        task = "segmentation"  # not a task
        picture_kind = "depth"  # with no map to draw it from
        processor = "mypackage.runtime:HalfProcessor"  # a string, not a class

    with pytest.raises(TypeError) as err:
        register(Half)
    message = str(err.value)
    for needle in ("write ", "load", "matches", "task_metrics", "set example", "set framework", "set output_names",
                   "'segmentation'", "picture_map", "processor must be a class"):
        assert needle in message, (needle, message)
    from enginekit.families import registered

    assert Half not in registered()
