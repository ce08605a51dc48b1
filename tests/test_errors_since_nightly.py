"""The bad inputs found on the release after ``make nightly`` was advertised: each one line, its documented exit code,
no traceback, nothing half-written; and the messages name what a file is and the form or command that works.

- a stored repair that does not parse as one is corrupt: a warning, measured again, never used (no crash later);
- a backend that cannot run here is said (exit 3) before any export or build;
- a file given as weights is named by what it is (an Ultralytics checkpoint, a module saved whole, empty,
  truncated), never with torch's own text; a missing file is "not found", whatever its suffix;
- a graph whose outputs are not its recorded task's is refused when it is loaded;
- ``--imgsz`` is named as given, and its own form is the one suggested;
- JUnit names (suites, cases, properties) are stable and unique; the failure count counts checks;
- the predict note, the class counts' order and a progress line say what Ultralytics' would.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> Path:
    import ultralytics

    path = tmp_path_factory.mktemp("photo") / "bus.jpg"
    shutil.copy(Path(ultralytics.__file__).parent / "assets" / "bus.jpg", path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory, trained_detector):
    """v8n.pt (an Ultralytics detect checkpoint), tv.pt (a torchvision module saved whole), sd.pt (a state dict),
    empty.pt, truncated.pt."""
    import torch
    import torchvision

    root = tmp_path_factory.mktemp("weights")
    shutil.copy(trained_detector.weights, root / "v8n.pt")
    torch.save(torchvision.models.mobilenet_v3_small(num_classes=10), root / "tv.pt")
    torch.save(torchvision.models.mobilenet_v3_small(num_classes=10).state_dict(), root / "sd.pt")
    (root / "empty.pt").write_bytes(b"")
    data = (root / "v8n.pt").read_bytes()
    (root / "truncated.pt").write_bytes(data[: len(data) // 3])
    return root


# --------------------------------------------------------------------------- what a file is

def test_an_ultralytics_checkpoint_given_as_depth_weights_names_what_it_is(files, run_cli):
    result = run_cli("export", "depth", "-w", str(files / "v8n.pt"), "-o", "x.onnx", env=NO_GPU)
    line = assert_one_line_error(result, 2, "v8n.pt is an Ultralytics checkpoint (a detect model, 3 classes",
                                 "enginekit export v8n.pt")
    assert "\x1b" not in result.stderr and "[1m" not in line and "weights_only" not in line


def test_a_module_saved_whole_given_as_weights_says_how_to_save_its_state_dict(files, run_cli):
    result = run_cli("export", "torchvision:mobilenet_v3_small", "--classes", "10", "-w", str(files / "tv.pt"),
                     "-o", "x.onnx", env=NO_GPU)
    line = assert_one_line_error(result, 2, "tv.pt is a whole MobileNetV3 module pickled by torch.save(model)",
                                 "torch.save(model.state_dict()")
    assert "\x1b" not in result.stderr and "weights_only" not in line


@pytest.mark.parametrize("name,needle", [("empty.pt", "empty (0 bytes)"), ("truncated.pt", "truncated"),
                                         ("sd.pt", "a state dict of")])
def test_a_pt_that_is_not_a_checkpoint_says_what_it_is(files, run_cli, name, needle):
    line = assert_one_line_error(run_cli("export", str(files / name), env=NO_GPU), 2, needle)
    assert "TorchScript program (" not in line.split(needle)[0]


def test_a_missing_file_is_not_found_whatever_its_suffix(run_cli, tmp_path):
    for name in ("nope.pt", "nope.pth"):
        line = assert_one_line_error(run_cli("export", str(tmp_path / name)), 2, "not found", name)
        assert "saved program" not in line


def test_the_safe_loader_describes_files_without_running_them(files):
    from enginekit.families.checkpoints import describe_torch_file

    assert describe_torch_file(files / "empty.pt") == "empty (0 bytes)"
    assert "truncated" in describe_torch_file(files / "truncated.pt")
    assert describe_torch_file(files / "sd.pt").startswith("a state dict of ")
    assert describe_torch_file(files / "v8n.pt") == "an Ultralytics checkpoint"
    assert describe_torch_file(files / "tv.pt").startswith("a whole MobileNetV3 module")


# --------------------------------------------------------------------------- before any work

def test_a_backend_that_cannot_run_here_is_refused_before_any_export(run_cli, photo, tmp_path):
    """``predict ... --backend tensorrt`` where TensorRT cannot run engines: exit 3 at once, nothing exported, built
    or cached (where it can run here, this machine has nothing to refuse)."""
    from enginekit.backends import get

    backend = get("tensorrt")
    if backend.check(device=backend.default_device(None)).ok:
        pytest.skip("TensorRT runs engines on this machine: nothing to refuse")
    cache = tmp_path / "cache"
    for precision in ("fp32", "int8"):
        result = run_cli("predict", "yolo12n", str(photo), "--random-init", "--imgsz", "160", "--precision",
                         precision, "--backend", "tensorrt", env={"ENGINEKIT_CACHE": str(cache)})
        assert_one_line_error(result, 3, "tensorrt backend cannot run here", "nothing was exported or built")
    assert not list(cache.rglob("manifest.json"))


# --------------------------------------------------------------------------- a stored repair that is not one

def test_a_corrupt_stored_repair_is_said_and_not_used(tmp_path):
    from enginekit import reporting
    from enginekit.cache import Cache
    from enginekit.pipeline import Stages, repair_record_problem

    cache = Cache(tmp_path / "cache")
    search = {"search": "measured-effect/3", "source": "0" * 64}
    good = {"nodes": ["/model.0/conv/Conv"], "result": {"nodes": ["/model.0/conv/Conv"], "trials": 3}}
    assert repair_record_problem(good) is None
    cache.get_or_create("repair", search, lambda _t: {"nodes": good["nodes"], "result": {"nodes": 3}})
    pipe = Stages(None, cache)
    with reporting.collecting(True) as seen:
        assert pipe.recalled_repair(search) is None
    warned = [e.label for e in seen.events if e.kind == "warning"]
    assert any("stored repair" in w and "corrupt" in w and "measuring again" in w for w in warned), warned
    pipe.remember_repair(search, good["nodes"], good["result"])  # the search's result replaces the corrupt record
    assert pipe.recalled_repair(search).manifest["result"]["nodes"] == good["nodes"]


def test_describing_an_engine_reads_a_count_of_repaired_nodes_too():
    from types import SimpleNamespace

    from enginekit.flows.verify import describe_engine

    entry = SimpleNamespace(manifest={"precision": {"mode": "int8", "repaired_nodes": 3}, "profiles": []})
    assert "3 node(s) repaired" in describe_engine(entry)


# --------------------------------------------------------------------------- a graph that is not its task's

def test_a_classifier_whose_metadata_says_detect_is_refused_when_loaded(tmp_path, run_cli, photo):
    import onnx
    import torch

    class Classifier(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x.mean((2, 3)) @ torch.ones(3, 5), -1)

    path = tmp_path / "cls.onnx"
    torch.onnx.export(Classifier(), torch.zeros(1, 3, 64, 64), str(path), input_names=["images"],
                      output_names=["output0"], dynamo=False)
    model = onnx.load(str(path))
    for key, value in {"author": "Ultralytics", "description": "Ultralytics YOLO11n-cls model", "task": "detect",
                       "stride": "32", "imgsz": "[64, 64]", "names": str({i: f"c{i}" for i in range(5)}),
                       "batch": "1"}.items():
        model.metadata_props.add(key=key, value=value)
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, str(path))
    line = assert_one_line_error(run_cli("predict", str(path), str(photo)), 2, "cls.onnx", "detect", "output0",
                                 "has 2")
    assert "IndexError" not in line


# --------------------------------------------------------------------------- sizes as given

def test_imgsz_is_named_as_given_and_its_own_form_is_suggested(run_cli):
    line = assert_one_line_error(run_cli("export", "yolo12n", "--random-init", "--imgsz", "1080x1920", "-o", "x.onnx"),
                                 2, "--imgsz 1080x1920", "1080 is not a multiple of 32")
    assert "--input" not in line
    line = assert_one_line_error(run_cli("export", "yolo12n", "--random-init", "--imgsz", "640,640", "-o", "x.onnx"),
                                 2, "--imgsz '640,640'", "384x640")
    assert "1x3x640x640" not in line  # --imgsz takes no batch and channels
    line = assert_one_line_error(run_cli("export", "yolo12n", "--random-init", "--imgsz", "0", "-o", "x.onnx"),
                                 2, "--imgsz '0'", "positive")
    assert "0x0" not in line  # the size as typed, not the form it was read into


# --------------------------------------------------------------------------- reports CI reads

def _report(subject: str, engine: str, failing: str):
    from enginekit.compare.comparison import Check
    from enginekit.verification.gate import ArtifactReport, VerifyReport

    report = VerifyReport(subject, engine, "int8", "r" * 64, "hit")
    art = ArtifactReport("engine", "engine", "int8", key=engine)
    art.checks = [Check("engine", "parity boxes rel_l2", 0.06, "<=", 0.05, False),
                  Check.unmet("engine", failing)]
    report.artifacts = [ArtifactReport("onnx-int8", "onnx", "int8", key="g" * 64,
                                       checks=[Check("onnx-int8", "task recall", 0.9, ">=", 0.95, False)]), art]
    return report


def test_junit_names_are_unique_and_stable_from_run_to_run(tmp_path):
    from enginekit.verification.report import write_junit

    runs = []
    for figure in ("12", "48"):  # two runs whose failing conditions carry other figures
        reports = [_report("ui", "a" * 64, f"task: nothing to compare ({figure} detections, none kept)"),
                   _report("ui", "b" * 64, f"task: nothing to compare ({figure} detections, none kept)")]
        root = ET.parse(write_junit(reports, tmp_path / f"{figure}.xml")).getroot()
        suites = [s.get("name") for s in root.iter("testsuite")]
        assert len(set(suites)) == 2, suites
        for suite in root.iter("testsuite"):
            props = [p.get("name") for p in suite.iter("property")]
            assert props.count("key:engine") == 1, props
        runs.append(sorted((s.get("name"), c.get("classname"), c.get("name")) for s in root.iter("testsuite")
                           for c in s.iter("testcase")))
    assert runs[0] == runs[1], runs
    assert not any(figure in name for _, _, name in runs[0] for figure in ("12", "48")), runs[0]


def test_the_count_of_failed_checks_and_the_checks_listed_agree():
    from enginekit.cli.common import failure_summary

    failures = ["onnx-int8: task recall = 0.9 (limit >= 0.95)", "engine: task recall = 0.9 (limit >= 0.95)",
                "engine: parity boxes rel_l2 = 0.06 (limit <= 0.05)", "engine: task precision = 0.9 (limit >= 0.95)",
                "engine: task map50 = 0.8 (limit >= 0.9)"]
    line = failure_summary(failures)
    assert line.endswith("; and 1 more check"), line  # 5 checks: 4 said (one of them for two artifacts), 1 more


def test_pictures_of_several_engines_keep_apart(tmp_path):
    from enginekit.verification.pictures import picture_path

    a, b = _report("ui", "a" * 64, "x"), _report("ui", "b" * 64, "x")
    assert picture_path(tmp_path, a, a.artifacts[0], "-detections.png") != \
        picture_path(tmp_path, b, b.artifacts[0], "-detections.png")


# --------------------------------------------------------------------------- what is said as it runs

def test_the_class_counts_follow_the_class_order_as_ultralytics_lists_them():
    from enginekit.results import counted_names

    # most first would say "3 bus, 2 persons"; Ultralytics lists by class index (person 0 before bus 5)
    assert counted_names(["bus", "person", "bus", "person", "bus"], [5, 0, 5, 0, 5]) == "2 persons, 3 bus"


def test_the_predict_note_says_the_rectangles_of_common_frames():
    from enginekit.backends.base import SessionInfo
    from enginekit.families import resolve
    from enginekit.families.ultralytics.runtime import YoloProcessor

    cpu = SessionInfo("onnxruntime-cpu", "cpu", "images", ("output0",), (None, 3, None, None))
    note = YoloProcessor(resolve("yolov8n"), {}, cpu).input_note
    assert "16:9 frames: 384x640" in note and "4:3 frames: 480x640" in note, note


def test_a_progress_count_alone_says_its_label_once(monkeypatch):
    import io
    import time

    from rich.console import Console

    from enginekit import reporting
    from enginekit.cli.render import RichReporter

    out = io.StringIO()
    renderer = RichReporter(Console(file=out, force_terminal=False, width=200), heartbeat=0.05)
    with reporting.using(renderer):
        with reporting.progress("repair int8: measure 116 quantized nodes", total=116) as bar:
            bar.advance(3)
            time.sleep(0.3)
    beats = [line for line in out.getvalue().splitlines() if "still running" in line]
    assert beats and all(line.count("measure 116 quantized nodes") == 1 for line in beats), beats
    assert "3/116" in beats[-1]


def test_the_first_predict_of_a_checkpoint_shows_its_export(trained_detector, run_cli, photo, tmp_path):
    shutil.copy(trained_detector.weights, tmp_path / "best.pt")
    result = run_cli("predict", "best.pt", str(photo), "--json", env={"ENGINEKIT_CACHE": str(tmp_path / "cache")})
    assert result.code == 0, result.stderr
    assert "export" in result.stderr and "simplify" in result.stderr, result.stderr
    assert json.loads(result.stdout)
