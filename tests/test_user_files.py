"""Every file Ultralytics loads is a model enginekit runs, no name needed (the corpus: ``tests/user_files.py``).

Checkpoints made the way they arise (a fine-tune from a ``best.pt`` with no ``yaml_file``, old-style multiples, a
team-renamed YAML, ``scales`` without ``scale``, a P2 variant, task models without ``yaml_file``) and the ONNX files
Ultralytics exports from them at its defaults (static, dynamic, half, nms): ``load``/``predict`` give what
``YOLO(file).predict`` gives on non-square frames, ``export`` names the file, a name given with ``-w`` is checked by
the checkpoint's layers, no refusal points at another, ``verify --data`` scores the fine-tuned checkpoint as
``YOLO(file).val`` does, and build, verify, deploy and bench take the files.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from conftest import assert_one_line_error
from user_files import checkpoints, corpus
from user_files_check import compare_file


@pytest.fixture(scope="module")
def files():
    return corpus()


@pytest.fixture(scope="module")
def by_name(files):
    return {f.name: f for f in files}


def test_every_user_file_predicts_as_ultralytics_does(files, tmp_path, cache):
    """For every corpus file: ``enginekit.load(file)`` finds what ``YOLO(file).predict`` finds (same count, IoU >=
    0.99, same classes; rotated IoU for obb; top-1 for classify) on two photographs and a frame of shapes, none
    square. The comparison must compare something: over the corpus, hundreds of instances."""
    failures, compared = [], 0
    for f in files:
        result = compare_file(f.path, f.task, tmp_path, backend="onnxruntime-cpu", cache=cache)
        compared += result.instances
        if not result.same:
            failures.append(f"{f.name} ({f.how}): {result.detail}")
    assert not failures, failures
    assert compared >= 200, compared
    kinds = {(f.task, f.kind) for f in files}
    assert {("detect", k) for k in ("checkpoint", "static", "dynamic", "half", "nms")} <= kinds


def test_export_of_every_checkpoint_passes_and_names_the_file(files, cache, tmp_path):
    from enginekit import api

    for f in checkpoints(files):
        result = api.export(str(f.path), output=tmp_path / f"{f.path.stem}.onnx", cache=cache, quiet=True)
        assert result.passed, (f.name, result.failures())
        assert result.model == f.path.stem and (tmp_path / f"{f.path.stem}.onnx").is_file()


def test_the_cli_names_the_file_and_what_it_holds(by_name, run_cli, tmp_path):
    shutil.copy(by_name["people.pt"].path, tmp_path / "people.pt")
    result = run_cli("export", "people.pt")
    assert result.code == 0, result.stderr
    text = " ".join(result.stderr.split())
    assert "people.pt: a detect model, 3 classes (its YAML records no file)" in text
    assert "people.simplify fp32" in text and "(None)" not in text and "yolov8" not in text
    assert result.stdout.strip().endswith("people.onnx")


def test_a_name_is_checked_by_layers_not_by_yaml_text(by_name, run_cli, tmp_path):
    """Every spelling of yolov8n's YAML (recorded, none, old-style multiples, a team's copy) is yolov8n; the same
    checkpoint given as yolo12n, yolov8s or a segmenter is refused, naming what it is and the command that works."""
    from enginekit.errors import UsageError
    from enginekit.model import ModelRequest

    for name in ("trained.pt", "people.pt", "legacy.pt", "ppe-detector-v3.pt"):
        path = by_name[name].path
        assert ModelRequest("yolov8n", path).adapter.variant == "yolov8n"
        for other in ("yolo12n", "yolov8s", "yolov8n-seg"):
            with pytest.raises(UsageError) as refused:
                ModelRequest(other, path)
            line = str(refused.value)
            assert f"{name} is a detect model, 3 classes" in line and other in line, line
            assert f"enginekit export {name}" in line
    line = assert_one_line_error(run_cli("export", "yolo12n", "-w", str(by_name["legacy.pt"].path), "-o", "x.onnx"), 2,
                                 "legacy.pt is a detect model, 3 classes (its YAML records no file)", "not yolo12n's")
    assert "enginekit export legacy.pt" in line and not (tmp_path / "x.onnx").exists()


REFUSALS = [
    ["export", "yolo12n", "-w", "{people}"],
    ["export", "yolov8n-seg", "-w", "{people}"],
    ["export", "yolo11n-cls", "-w", "{seg}"],
    ["export", "{people}", "--random-init"],
    ["export", "{people}", "-w", "{legacy}"],
    ["predict", "{people}", "{photo}", "--task", "classify"],
    ["export", "{people_onnx}", "--fp16"],
]


def test_no_refusal_points_at_another(by_name, run_cli, tmp_path):
    """Each refusal's suggested command (the ``enginekit ...`` it names), run as given, is not refused the same way
    (the two refusals of the last release pointed at each other: there was no way forward)."""
    import ultralytics

    for key, name in (("people", "people.pt"), ("legacy", "legacy.pt"), ("seg", "seg.pt"),
                      ("people_onnx", "people.static.onnx")):
        shutil.copy(by_name[name].path, tmp_path / name)
    shutil.copy(Path(ultralytics.__file__).parent / "assets" / "bus.jpg", tmp_path / "bus.jpg")
    names = {"people": "people.pt", "legacy": "legacy.pt", "seg": "seg.pt", "people_onnx": "people.static.onnx",
             "photo": "bus.jpg"}
    walked = 0
    for args in REFUSALS:
        given = [a.format(**names) for a in args]
        line = assert_one_line_error(run_cli(*given), 2)
        suggested = re.search(r"\(?(enginekit (?:export|build|predict|verify) [^)]+?)(?:\)|, which| makes|$)", line)
        dropped = re.search(r"drop (--[a-z-]+)", line)
        assert suggested or dropped, line  # a command to run, or the flag to take away
        if suggested:
            command = shlex.split(suggested.group(1))[1:]
        else:  # the same command without the flag (and its value, where it takes one)
            aliases = {"--weights": ("-w", "--weights")}.get(dropped.group(1), (dropped.group(1),))
            at = next(i for i, a in enumerate(given) if a in aliases)
            takes_value = at + 1 < len(given) and not given[at + 1].startswith("-") and dropped.group(1) != "--random-init"
            command = given[:at] + given[at + 1 + takes_value:]
        again = run_cli(*command)
        refusals = [x for x in again.error_lines if x.startswith("error:")]
        assert again.code in (0, 1) or refusals and refusals[0] != line, (line, command, again.stderr[-500:])
        walked += 1
    assert walked == len(REFUSALS)


def test_verify_data_on_a_fine_tuned_checkpoint_equals_yolo_val(by_name, cache, tmp_path):
    """``verify people.pt --data`` (no yaml_file in it) scores FP32 as ``YOLO('people.pt').val(batch=1)`` does."""
    from trained_detector import write_dataset
    from ultralytics import YOLO

    from enginekit import api

    data = write_dataset(tmp_path / "data")
    path = str(by_name["people.pt"].path)
    outcome = api.verify(path, data=str(data), cache=cache, quiet=True)
    assert outcome.passed
    scored = [a for r in outcome.reports for a in r.artifacts if a.ground_truth]
    assert scored
    ours = scored[0].ground_truth["reference"]["map50_95"]
    theirs = YOLO(path).val(data=str(data), batch=1, plots=False, verbose=False).box.map
    assert abs(ours - theirs) <= 0.002, (ours, theirs)
    assert 0.3 < theirs < 0.95  # a real score: the gate can move


def test_an_ultralytics_onnx_builds_and_verifies_by_verdict(by_name, tmp_path, detector_images, cache):
    """build --precision fp16 / int8 --calib-data and verify --reference on Ultralytics' own exports (static, dynamic,
    half: its nodes out of order and FP16, widened for INT8; nms: ONNX NonMaxSuppression, which TensorRT-RTX has no
    layer for, a missing capability): a verdict or a capability, never bad input."""
    from enginekit import api
    from enginekit.errors import CapabilityError, ParityError

    people = by_name["people.pt"].path
    for name in ("people.static.onnx", "people.dynamic.onnx", "people.half.onnx", "people.nms.onnx"):
        path = str(by_name[name].path)
        size = {"imgsz": 160} if "dynamic" in name else {}
        for extra in ({"precision": "fp16"}, {"precision": "int8", "calib_data": detector_images, "calib_count": 4}):
            try:
                outcome = api.build(path, cache=cache, quiet=True, **size, **extra)
                assert outcome.manifest["precision"]["mode"] == extra["precision"]
            except CapabilityError as exc:
                assert "nms" in name and "NonMaxSuppression" in str(exc), (name, exc)
            except ParityError:
                pass  # a verdict
        try:
            api.verify(path, reference=people, images=detector_images, cache=cache, quiet=True)
        except ParityError:
            pass


def test_deploy_and_bench_take_a_checkpoint_and_its_onnx(by_name, run_cli, tmp_path):
    people, onnx = str(by_name["people.pt"].path), str(by_name["people.static.onnx"].path)
    deployed = run_cli("deploy", "triton", people, "--repo", "models")
    assert deployed.code == 0, deployed.stderr
    assert (tmp_path / "models" / "people" / "config.pbtxt").is_file()
    assert (tmp_path / "models" / "people-net" / "1" / "model.onnx").is_file()
    for target in (people, onnx):
        timed = run_cli("bench", target, "--backend", "onnxruntime-cpu", "--iters", "3", "--warmup", "1", "--json")
        assert timed.code == 0, timed.stderr
        assert '"p50' in timed.stdout or "p50" in timed.stdout
