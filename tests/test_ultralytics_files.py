"""The files Ultralytics wrote for a user, and the checkpoint's own identity.

- ``best.pt`` is its model (the module it holds): ``export best.pt`` works as ``yolo export model=best.pt``; a
  checkpoint given to a model name whose layers it does not have is refused, naming what it is.
- An ONNX file Ultralytics exported (its ``metadata_props``) runs in ``load``/``predict`` as ``YOLO(onnx).predict``
  runs it, builds FP16 and INT8 engines with calibration, and verifies against its ``.pt``.
- An engine file with Ultralytics' header (4-byte little-endian length, JSON, then the plan) is read; ``build
  --ultralytics-metadata`` writes that layout, byte for byte what Ultralytics' own reader takes apart.
- One-to-one heads (yolo26) compare their kept rows paired, ties and all: yolo26n-seg's FP32 and FP16 exports pass.

The detector is the suite's trained one (its scores spread, so every comparison could fail).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error

PHOTOS = ("bus.jpg", "zidane.jpg")  # 810x1080 and 1280x720: neither square


@pytest.fixture(scope="module")
def ultralytics_files(trained_detector, tmp_path_factory):
    """The trained detector's checkpoint as ``best.pt``, and the ONNX files Ultralytics exports from it at 320: a
    fixed-size one and a dynamic one (Ultralytics' own exporter, offline)."""
    from ultralytics import YOLO

    root = tmp_path_factory.mktemp("ultralytics-files")
    best = root / "best.pt"
    shutil.copy(trained_detector.weights, best)
    for name, dynamic in (("static", False), ("dynamic", True)):
        out = Path(YOLO(str(best)).export(format="onnx", imgsz=320, dynamic=dynamic, simplify=False))
        out.rename(root / f"best.{name}.onnx")
    import ultralytics

    for photo in PHOTOS:
        shutil.copy(Path(ultralytics.__file__).parent / "assets" / photo, root / photo)
    return root


def _entries(cache_root: Path) -> list[str]:
    if not cache_root.is_dir():
        return []
    return [f"{k.name}/{e.name}" for k in cache_root.iterdir() if k.is_dir() and not k.name.startswith(".")
            for e in k.iterdir()]


# --------------------------------------------------------------------------- the checkpoint's identity


@pytest.mark.parametrize("named", ["yolo12n", "yolo11n", "yolov8s"])
def test_a_checkpoint_of_another_architecture_is_refused(ultralytics_files, run_cli, tmp_path, named):
    """It exported, and wrote a graph, metadata and cache entries labelled with the wrong model. The layers are
    compared (not the YAML's text), before any cached artifact is served."""
    result = run_cli("export", named, "-w", str(ultralytics_files / "best.pt"), "-o", "out.onnx",
                     env={"ENGINEKIT_CACHE": str(tmp_path / "cache")})
    assert_one_line_error(result, 2, "best.pt is a detect model, 3 classes (built from yolov8n.yaml)",
                          f"not {named}'s", "enginekit export best.pt")
    assert not (tmp_path / "out.onnx").exists() and _entries(tmp_path / "cache") == []


def test_the_checkpoint_alone_is_its_model(ultralytics_files, run_cli, tmp_path):
    """``export best.pt`` (``yolo export model=best.pt``'s habit) takes the model the checkpoint holds and calls it by
    the file, writes best.onnx, and so do predict and ``enginekit.load``."""
    shutil.copy(ultralytics_files / "best.pt", tmp_path / "best.pt")
    result = run_cli("export", "best.pt", "--input", "1x3x320x320")
    assert result.code == 0, result.stderr
    assert "best.pt: a detect model, 3 classes (built from yolov8n.yaml)" in result.stderr
    assert result.stdout.strip().endswith("best.onnx") and (tmp_path / "best.onnx").is_file()
    from enginekit.onnx.graph import get_metadata, load_model

    meta = get_metadata(load_model(tmp_path / "best.onnx"))
    assert meta["model"] == "best" and meta["weights"].startswith("sha256:")
    assert meta["model_source"] == "checkpoint" and meta["architecture"] == "yolov8n"
    shutil.copy(tmp_path / "best.pt", tmp_path / "other.pt")  # another file's weights contradict it
    for refused in (["export", "best.pt", "--random-init"], ["export", "best.pt", "-w", "other.pt"]):
        assert_one_line_error(run_cli(*refused), 2, "best.pt is an Ultralytics checkpoint")
    assert run_cli("export", "best.pt", "-w", "best.pt", "--input", "1x3x320x320").code == 0  # the same file: said twice

    import enginekit

    predictor = enginekit.load(str(tmp_path / "best.pt"), backend="onnxruntime-cpu", input_size=320)
    assert predictor.model == "best"
    found = predictor(str(ultralytics_files / "bus.jpg"))
    assert len(found.boxes) > 0


# --------------------------------------------------------------------------- ONNX files Ultralytics exported


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_an_ultralytics_onnx_predicts_as_ultralytics_runs_it(ultralytics_files, kind):
    """``load`` and ``YOLO(onnx).predict`` give the same boxes (IoU >= 0.99), classes and scores on two non-square
    photographs: the fixed-size file at its square, the dynamic one at Ultralytics' predict size (640) per frame's
    rectangle."""
    from ultralytics import YOLO

    import enginekit
    from enginekit.compare.instances import Instances, box_iou

    path = ultralytics_files / f"best.{kind}.onnx"
    predictor = enginekit.load(str(path), backend="onnxruntime-cpu")
    assert predictor.model == "yolov8n" and predictor.family == "yolo"
    theirs = YOLO(str(path), task="detect")
    compared = 0
    for photo in PHOTOS:
        ours = predictor(str(ultralytics_files / photo))
        ref = theirs.predict(str(ultralytics_files / photo), verbose=False)[0]
        rb, rs, rc = ref.boxes.xyxy.numpy(), ref.boxes.conf.numpy(), ref.boxes.cls.numpy().astype(int)
        assert len(ours.boxes) == len(rb), (photo, len(ours.boxes), len(rb))
        if not len(rb):
            continue
        iou = box_iou(Instances(rb, rs, rc), Instances(np.asarray(ours.boxes), np.asarray(ours.scores),
                                                        np.asarray(ours.class_ids).astype(int)))
        best = iou.argmax(1)
        assert iou.max(1).min() >= 0.99, (photo, iou.max(1))
        assert (np.asarray(ours.class_ids)[best] == rc).all()
        np.testing.assert_allclose(np.asarray(ours.scores)[best], rs, atol=1e-4)
        compared += len(rb)
    assert compared >= 10, compared  # the trained detector finds its shapes' colours in both photographs


def test_an_ultralytics_onnx_builds_fp16_and_int8_and_verifies_against_its_checkpoint(ultralytics_files, run_cli,
                                                                                      detector_images, tmp_path):
    """It was refused ("names no model family" for INT8 calibration; "pass --model" for verify)."""
    path = str(ultralytics_files / "best.static.onnx")
    for precision, extra in (("fp16", []), ("int8", ["--calib-data", str(detector_images)])):
        result = run_cli("build", path, "--precision", precision, *extra)
        assert result.code == 0, result.stderr
        manifest = json.loads((Path(result.stdout.strip()).parent / "manifest.json").read_text())
        assert manifest["precision"]["mode"] == precision
    # the family's INT8 exclusions applied: the head's last convolutions stayed out of INT8
    verified = run_cli("verify", path, "--reference", str(ultralytics_files / "best.pt"), "--images", str(detector_images))
    assert verified.code == 0, verified.stderr
    assert "recall 1" in " ".join(verified.stderr.split())
    # an ONNX with no model in its metadata takes its name from the checkpoint it is compared against
    import onnx

    model = onnx.load(path)
    del model.metadata_props[:]
    onnx.save(model, str(tmp_path / "bare.onnx"))
    bare = run_cli("verify", "bare.onnx", "--reference", str(ultralytics_files / "best.pt"), "--images",
                   str(detector_images))
    assert bare.code == 0, bare.stderr


@pytest.mark.parametrize("change, needle", [
    ({"task": None}, "task missing"),
    ({"names": "['a', 'b']"}, "names is not a mapping"),
    ({"stride": "0"}, "stride '0'"),
    ({"imgsz": "[320, 321]"}, "imgsz"),
])
def test_partial_or_contradictory_ultralytics_metadata_is_one_line(ultralytics_files, run_cli, tmp_path, change,
                                                                   needle):
    import onnx

    model = onnx.load(str(ultralytics_files / "best.static.onnx"))
    props = {p.key: p.value for p in model.metadata_props}
    for key, value in change.items():
        if value is None:
            props.pop(key)
        else:
            props[key] = value
    onnx.helper.set_model_props(model, props)
    onnx.save(model, str(tmp_path / "odd.onnx"))
    for args in (["predict", "odd.onnx", str(ultralytics_files / "bus.jpg"), "--save", "out"],
                 ["verify", "odd.onnx", "--reference", str(ultralytics_files / "best.pt")]):
        assert_one_line_error(run_cli(*args, env={"ENGINEKIT_CACHE": str(tmp_path / "cache")}), 2, "odd.onnx", needle)
    assert not (tmp_path / "out").exists() and _entries(tmp_path / "cache") == []


# --------------------------------------------------------------------------- engine files with Ultralytics' header


@pytest.fixture(scope="module")
def engine(ultralytics_files, tmp_path_factory):
    """An engine of the trained detector at 320 (TensorRT-RTX builds on any machine), and its copy with the header."""
    from enginekit import api
    from enginekit.flows.build import write_engine_file

    outcome = api.build(str(ultralytics_files / "best.pt"), profiles=["1x3x320x320"], verify=False, quiet=True)
    dest = write_engine_file(outcome, tmp_path_factory.mktemp("engine") / "best.engine", ultralytics=True)
    return outcome, dest


def test_build_ultralytics_metadata_writes_the_layout_ultralytics_reads(engine):
    """Length (4 bytes, little-endian), JSON with what AutoBackend uses, then the cached plan byte for byte; read by
    Ultralytics' own header reader and by enginekit's."""
    from ultralytics.nn.backends.base import BaseBackend

    from enginekit.engine_file import plan_bytes, read_header

    outcome, path = engine
    data = path.read_bytes()
    length = int.from_bytes(data[:4], "little")
    header = json.loads(data[4:4 + length])
    plan = outcome.engine.read_bytes()
    assert data[4 + length:] == plan and plan[:4] in (b"ftrt", b"vtrt")
    assert outcome.engine.read_bytes()[:4] != data[:4]  # the cache keeps the bare plan (trtexec, C++, Triton)
    assert header["task"] == "detect" and header["stride"] == 32 and header["imgsz"] == [320, 320]
    assert header["batch"] == 1 and header["names"] == {"0": "red circle", "1": "green square", "2": "blue triangle"}
    assert header["description"].startswith("Ultralytics YOLOv8n model") and header["end2end"] is False
    assert header["enginekit"]["engine"] == outcome.entry.key
    offset, theirs = BaseBackend.engine_header(path)
    assert offset == 4 + length and theirs == header
    assert read_header(path) == (offset, header) and plan_bytes(path) == plan
    assert read_header(outcome.engine) == (0, None)


def test_an_ultralytics_engine_file_is_read_by_the_runtime_and_verify(engine, ultralytics_files, run_cli):
    """Its header names the model (predict and verify know it is a yolov8n at 320); it runs where its TensorRT and a
    GPU are, and says so in one line where they are not."""
    from enginekit.runtime.loader import resolve_target

    _, path = engine
    target = resolve_target(str(path))
    assert target.kind == "engine" and target.model == "yolov8n"
    assert target.metadata["export_shape"] == "1x3x320x320" and target.manifest["header_bytes"] > 4
    from enginekit.trt.session import engine_runs_here

    if engine_runs_here(target.manifest).ok:
        pytest.skip("the engine runs here: the GPU tests compare its detections")
    for args in (["predict", str(path), str(ultralytics_files / "bus.jpg")],
                 ["verify", str(path), "--weights", str(ultralytics_files / "best.pt")]):
        assert_one_line_error(run_cli(*args), 3, "cannot run here")
    assert_one_line_error(run_cli("verify", str(path)), 2, "needs its PyTorch weights")


@pytest.mark.parametrize("damage, needle", [
    (lambda d, n: (2**30).to_bytes(4, "little") + d[4:], "holds"),  # a length past the file's end
    (lambda d, n: d[:4] + b"{not json" + d[13:], "not JSON"),  # the header's bytes damaged
    (lambda d, n: d[:4 + n], "no TensorRT plan follows"),  # cut after the header
    (lambda d, n: d[:2], "no TensorRT plan"),  # cut inside the length
])
def test_a_damaged_engine_header_is_one_line(engine, ultralytics_files, run_cli, tmp_path, damage, needle):
    _, path = engine
    data = path.read_bytes()
    (tmp_path / "bad.engine").write_bytes(damage(data, int.from_bytes(data[:4], "little")))
    for args in (["predict", "bad.engine", str(ultralytics_files / "bus.jpg"), "--save", "out"],
                 ["verify", "bad.engine", "--weights", str(ultralytics_files / "best.pt")]):
        assert_one_line_error(run_cli(*args), 2, "bad.engine", needle)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- one-to-one heads


def test_yolo26n_seg_random_init_passes_fp32_and_fp16_parity(cache, tmp_path):
    """Its kept rows with tied scores were compared unpaired (boxes rel L2 0.93): now paired, as detection's."""
    from enginekit import api

    result = api.export("yolo26n-seg", random_init=True, fp16=True, input="1x3x320x320", cache=cache,
                        output=tmp_path / "seg.fp16.onnx", quiet=True)
    assert result.passed, result.failures()
    assert (tmp_path / "seg.fp16.onnx").is_file()
    assert {r.precision for r in result.parity} == {"fp32", "fp16"}


def test_a_graph_enginekit_made_from_an_ultralytics_onnx_keeps_its_precision(ultralytics_files):
    """The FP16/INT8 graphs built from an Ultralytics ONNX carry its metadata plus enginekit's ``precision``: read
    as the model it records *and* at that precision (a verify of the INT8 graph was judged at FP32's limits)."""
    import onnx

    from enginekit.families.registry import graph_metadata
    from enginekit.onnx.graph import get_metadata

    theirs = get_metadata(onnx.load(str(ultralytics_files / "best.static.onnx"), load_external_data=False))
    assert "precision" not in graph_metadata(theirs)  # Ultralytics' own FP32 file records none
    built = graph_metadata({**theirs, "precision": "int8", "int8_method": "max"})
    assert built["model"] == "yolov8n" and built["precision"] == "int8" and built["int8_method"] == "max"


@pytest.mark.parametrize("task", ["classify", "detect", "segment"])
def test_a_dynamic_ultralytics_file_runs_at_the_size_its_predictor_uses(task):
    """``YOLO(file).predict`` runs a file of dynamic H/W at its default 640 whatever the recorded imgsz and whatever
    the family's own default (classify's is 224): enginekit's processor takes the same size; a static file its own."""
    from types import SimpleNamespace

    from enginekit.families.processing import network_hw
    from enginekit.families.ultralytics.identity import adopt_ultralytics_metadata
    from ultralytics.cfg import DEFAULT_CFG

    meta = {"author": "Ultralytics", "description": "Ultralytics best model trained on data.yaml", "task": task,
            "names": "{0: 'a', 1: 'b'}", "stride": "32", "imgsz": "[96, 96]", "batch": "1",
            "args": "{'batch': 1, 'dynamic': True, 'half': False}", "version": "8.4.0"}
    adapter = SimpleNamespace(default_input=(1, 3, 224, 224), export_at_profile_size=False)
    dynamic = adopt_ultralytics_metadata(meta)
    assert network_hw(adapter, SimpleNamespace(fixed_hw=None), None, dynamic) == (DEFAULT_CFG.imgsz,) * 2
    assert network_hw(adapter, SimpleNamespace(fixed_hw=None), 320, dynamic) == (320, 320)  # asked for: that size
    static = adopt_ultralytics_metadata({**meta, "args": "{'batch': 1, 'dynamic': False}"})
    assert "runs_at" not in static
    assert network_hw(adapter, SimpleNamespace(fixed_hw=(96, 96)), None, static) == (96, 96)
