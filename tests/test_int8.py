"""INT8 Q/DQ through ModelOpt on real (random-weight) graphs, and its calibration cache."""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from enginekit.cache import Cache
from enginekit.hashing import key_for
from enginekit.errors import UsageError
from enginekit.onnx import runtime
from enginekit.pipeline import CacheLayouts
from enginekit.onnx.graph import get_metadata
from enginekit.stages.int8 import (
    CALIBRATION_METHODS,
    Int8Report,
    cache_header,
    quantize_int8,
    read_calibration_cache,
    write_calibration_cache,
)

N_IMAGES = 4


@dataclass
class Quantized:
    fp32: Path
    int8: Path
    cache: Path
    report: Int8Report
    calibration: np.ndarray
    input_name: str
    exclude: list[str]
    sessions: list[str]  # what ONNX Runtime sessions the calibrating run opened
    layouts: object  # where the calibrating run kept its Q/DQ layout (pipeline.CacheLayouts)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    """Exports go to a cache of their own; models are built offline from random weights."""
    root = tmp_path_factory.mktemp("int8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENGINEKIT_CACHE", str(root / "cache"))
        mp.setenv("YOLO_CONFIG_DIR", os.environ.get("YOLO_CONFIG_DIR", str(root / "ultralytics")))
        mp.setenv("YOLO_OFFLINE", "1")
        yield root


def export(workdir: Path, model: str, shape: str) -> Path:
    from enginekit import api
    from enginekit.cache import Cache

    result = api.export(model, random_init=True, input=shape, output=workdir / f"{model}.onnx",
                        cache=Cache(workdir / "cache"), quiet=True)
    assert result.passed, result.failures()
    return result.output


def calibration_batch(model: str, hw: tuple[int, int]) -> np.ndarray:
    from enginekit.images import load_images
    from enginekit.families import resolve

    adapter = resolve(model)
    photos = load_images(None, limit=N_IMAGES)
    return np.concatenate([adapter.preprocess(image, hw) for image in photos.images])


def session_spy(mp: pytest.MonkeyPatch) -> list[str]:
    """Record every ONNX Runtime session opened: a calibrating run opens one on an augmented model."""
    import onnxruntime

    opened: list[str] = []
    real_init = onnxruntime.InferenceSession.__init__

    def init(self, model, *args, **kwargs):
        opened.append(model if isinstance(model, str) else "<bytes>")
        real_init(self, model, *args, **kwargs)

    mp.setattr(onnxruntime.InferenceSession, "__init__", init)
    return opened


def detect_head_pattern(path: Path) -> str:
    """YOLO's Detect head is its last top-level module: model.21 in yolo12n, model.23 in yolo11n."""
    model = onnx.load(str(path))
    index = max(int(m[1]) for n in model.graph.node if (m := re.match(r"/model\.(\d+)/", n.name)))
    return rf"/model\.{index}/.*"


@pytest.fixture(scope="session")
def yolo(workdir) -> Quantized:
    fp32 = export(workdir, "yolo12n", "1x3x320x320")
    batch = calibration_batch("yolo12n", (320, 320))
    exclude = [detect_head_pattern(fp32)]
    out, cache = workdir / "yolo12n.int8.onnx", workdir / "yolo12n.calib"
    layouts = CacheLayouts(Cache(workdir / "layouts"))
    with pytest.MonkeyPatch.context() as mp:
        opened = session_spy(mp)
        report = quantize_int8(fp32, out, batch, "images", exclude_nodes=exclude, write_cache=cache, layouts=layouts)
    return Quantized(fp32, out, cache, report, batch, "images", exclude, opened, layouts)


def ort_outputs(path: Path, batch: np.ndarray, extra: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Outputs image by image (the graphs take batch 1 as well as any), plus intermediate tensors."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in extra)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(names, {sess.get_inputs()[0].name: batch[i:i + 1]}) for i in range(len(batch))]
    return {name: np.concatenate([r[k] for r in runs]) for k, name in enumerate(names)}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def producers(model) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


# -- YOLO -------------------------------------------------------------------------------------


def test_int8_graph_has_qdq_nodes_and_keeps_metadata(yolo):
    model = onnx.load(str(yolo.int8))
    n_q = sum(n.op_type == "QuantizeLinear" for n in model.graph.node)
    assert yolo.report.calibrated and yolo.report.method == "entropy"
    assert n_q == yolo.report.n_qdq_nodes > 0
    assert sum(n.op_type == "DequantizeLinear" for n in model.graph.node) >= n_q
    meta, source = get_metadata(model), get_metadata(onnx.load(str(yolo.fp32)))
    assert {k: meta[k] for k in source if k != "precision"} == {k: v for k, v in source.items() if k != "precision"}
    assert meta["precision"] == "int8" and meta["int8_calibration_shape"] == "1x3x320x320"
    assert model.ir_version <= 10 and len(model.graph.value_info) == 0


def test_excluded_nodes_take_no_quantized_input(yolo):
    model = onnx.load(str(yolo.int8))
    pattern = re.compile(yolo.exclude[0])
    excluded = [n for n in model.graph.node if pattern.match(n.name)]
    source = onnx.load(str(yolo.fp32))
    assert yolo.report.n_excluded == sum(bool(pattern.match(n.name)) for n in source.graph.node) > 50
    made_by = producers(model)
    # A Shape node reads only its input's shape, so a Q/DQ pair in front of it (shared with a
    # quantized consumer of the same tensor) changes nothing.
    fed_by_dq = [(n.name, i) for n in excluded if n.op_type != "Shape"
                 for i in n.input if i in made_by and made_by[i].op_type == "DequantizeLinear"]
    assert fed_by_dq == []
    assert not any(pattern.match(n.name) for n in model.graph.node if n.op_type == "QuantizeLinear")


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref.astype(np.float64)))


def test_int8_graph_runs_on_ort_close_to_fp32(yolo):
    """The informative random yolo12n's outputs depend on the photograph (families/random_init.py),
    so INT8 is held to the family's INT8 limits on what it computes: boxes rel L2 <= 0.05, scores cosine >= 0.9."""
    from enginekit.families.ultralytics.base import _PART_TOLERANCES

    limits = _PART_TOLERANCES["int8"]
    ref = ort_outputs(yolo.fp32, yolo.calibration)["output0"]
    got = ort_outputs(yolo.int8, yolo.calibration)["output0"]
    # the reference depends on its input (a plain random YOLO's photographs differ by rel L2 7e-9)
    assert min(rel_l2(ref[i], ref[0]) for i in range(1, len(ref))) > 0.01
    boxes, scores = rel_l2(got[:, :4], ref[:, :4]), cosine(ref[:, 4:], got[:, 4:])
    print(f"yolo12n int8: boxes rel L2 {boxes:.4f}, scores cosine {scores:.4f}")
    assert np.isfinite(got).all()
    assert boxes <= limits["boxes"].rel_l2 and scores >= limits["scores"].cosine
    assert not np.array_equal(ref, got)  # INT8 did something


def test_calibration_cache_is_written_and_holds_the_graph_scales(yolo):
    assert yolo.report.cache_written == yolo.cache
    assert yolo.cache.read_text().splitlines()[0] == cache_header("entropy") == "TRT-100000-EntropyCalibration2"
    scales = read_calibration_cache(yolo.cache)
    assert len(scales) > 100 and all(s > 0 for s in scales.values())
    model = onnx.load(str(yolo.int8))
    inits = {i.name: i for i in model.graph.initializer}
    checked = 0
    for node in model.graph.node:
        # ModelOpt pins Softmax outputs to [0, 1] whatever was measured.
        if node.op_type == "QuantizeLinear" and node.input[0] in scales and "Softmax" not in node.input[0]:
            assert float(numpy_helper.to_array(inits[node.input[1]])) == scales[node.input[0]]
            checked += 1
    assert checked > 100


def test_quantizing_from_the_cache_gives_the_same_bytes_without_calibrating(yolo, tmp_path, monkeypatch):
    opened = session_spy(monkeypatch)
    out = tmp_path / "again.onnx"
    report = quantize_int8(yolo.fp32, out, None, "images", exclude_nodes=yolo.exclude, calibration_cache=yolo.cache)
    assert report.calibrated is False and report.cache_written is None
    assert out.read_bytes() == yolo.int8.read_bytes()
    assert report.n_qdq_nodes == yolo.report.n_qdq_nodes
    assert any(p.endswith("augmented_model.onnx") for p in yolo.sessions)  # the calibrating run did
    assert not any(p.endswith("augmented_model.onnx") for p in opened)
    print(f"yolo12n int8: calibrated {yolo.report.seconds:.2f}s, from cache {report.seconds:.2f}s")


def test_cache_missing_a_needed_tensor_is_a_usage_error(yolo, tmp_path):
    scales = read_calibration_cache(yolo.cache)
    scales.pop(sorted(scales)[0])
    partial = write_calibration_cache(tmp_path / "partial.calib", scales, cache_header("entropy"))
    with pytest.raises(UsageError, match="lacks 1 of"):
        quantize_int8(yolo.fp32, tmp_path / "x.onnx", None, "images", exclude_nodes=yolo.exclude,
                      calibration_cache=partial)
    assert not (tmp_path / "x.onnx").exists()


# -- kept Q/DQ layouts (stages/int8_layout.py): ModelOpt's graph without ModelOpt ------------------------------


class ModelOptRan(Exception):
    """Raised in place of ModelOpt's pass: the run would have needed it."""


def without_modelopt(mp: pytest.MonkeyPatch) -> None:
    """Fail any use of ModelOpt: its pass, and the check that imports it."""
    from enginekit.stages import int8

    def refuse(*args, **kwargs):
        raise ModelOptRan

    mp.setattr(int8, "_run_modelopt", refuse)
    mp.setattr(int8, "check", refuse)


def other_scales(path: Path, out: Path) -> Path:
    """The cache at ``path`` with every scale changed (0.5x to 2x, a different factor per tensor)."""
    scales = read_calibration_cache(path)
    factors = np.random.default_rng(7).uniform(0.5, 2.0, len(scales))
    return write_calibration_cache(out, {n: scales[n] * f for n, f in zip(sorted(scales), factors)},
                                   cache_header("entropy"))


def test_the_calibrating_run_keeps_a_compact_layout(yolo):
    (entry,) = sorted((yolo.layouts.cache.root / CacheLayouts.KIND).glob("*/manifest.json"))
    manifest = json.loads(entry.read_text())
    assert len(manifest["activation_scales"]) > 100 and len(manifest["from_source"]) > 50
    assert set(manifest["calibrated"]) == set(read_calibration_cache(yolo.cache))
    layout = entry.parent / "layout.onnx"
    assert layout.stat().st_size < yolo.int8.stat().st_size / 4  # the FP32 weights are not in it


@pytest.mark.slow
def test_a_kept_layout_rebuilds_modelopts_graph_without_modelopt(yolo, tmp_path, monkeypatch):
    """From the calibrating run's cache: its bytes. From other scales: ModelOpt's own graph for those scales."""
    with monkeypatch.context() as mp:
        without_modelopt(mp)
        same = quantize_int8(yolo.fp32, tmp_path / "same.onnx", None, "images", exclude_nodes=yolo.exclude,
                             calibration_cache=yolo.cache, layouts=yolo.layouts)
        other = other_scales(yolo.cache, tmp_path / "other.calib")
        rebuilt = quantize_int8(yolo.fp32, tmp_path / "rebuilt.onnx", None, "images", exclude_nodes=yolo.exclude,
                                calibration_cache=other, layouts=yolo.layouts, write_cache=tmp_path / "written.calib")
    assert same.layout == rebuilt.layout == "kept" and not same.calibrated
    assert (tmp_path / "same.onnx").read_bytes() == yolo.int8.read_bytes()
    assert same.n_qdq_nodes == rebuilt.n_qdq_nodes == yolo.report.n_qdq_nodes
    # the cache written beside it holds what ModelOpt's cached run hands over: the tensors it needs
    assert read_calibration_cache(tmp_path / "written.calib") == read_calibration_cache(other)
    own = quantize_int8(yolo.fp32, tmp_path / "own.onnx", None, "images", exclude_nodes=yolo.exclude,
                        calibration_cache=other)
    assert own.layout == "modelopt"
    assert (tmp_path / "rebuilt.onnx").read_bytes() == (tmp_path / "own.onnx").read_bytes()
    assert (tmp_path / "rebuilt.onnx").read_bytes() != yolo.int8.read_bytes()  # the scales did change the graph


def layout_variants(yolo, tmp_path, monkeypatch) -> dict[str, dict]:
    from enginekit.stages import int8, modelopt as ek_modelopt

    base = dict(src=yolo.fp32, input_name="images", method="entropy", exclude=yolo.exclude, high_precision="fp32",
                probe=(1, 3, 320, 320))
    edited = onnx.load(str(yolo.fp32))
    edited.graph.initializer[0].raw_data = bytes(len(edited.graph.initializer[0].raw_data))
    onnx.save(edited, str(tmp_path / "edited.onnx"))
    variants = {"same": {}, "method": {"method": "max"}, "exclude": {"exclude": [*yolo.exclude, r"/model\.2/.*"]},
                "no exclude": {"exclude": []}, "high precision": {"high_precision": "fp16"},
                "calibration shape": {"probe": (1, 3, 256, 256)}, "batch": {"probe": (2, 3, 320, 320)},
                "graph": {"src": tmp_path / "edited.onnx"}, "input": {"input_name": "x"}}
    parts = {name: int8.layout_parts(**{**base, **change}) for name, change in variants.items()}
    with monkeypatch.context() as mp:
        mp.setattr(int8, "installed", lambda: {**ek_modelopt.installed(), "nvidia-modelopt": "0.48.0"})
        parts["versions"] = int8.layout_parts(**base)
    with monkeypatch.context() as mp:
        other = ["cuda:0", "cpu"] if int8.calibration_eps() == ["cpu"] else ["cpu"]
        mp.setattr(int8, "calibration_eps", lambda: other)
        parts["providers"] = int8.layout_parts(**base)
    with monkeypatch.context() as mp:
        mp.setattr(int8, "MODELOPT_SETTINGS", {**int8.MODELOPT_SETTINGS, "per_channel": False})
        parts["settings"] = int8.layout_parts(**base)
    return parts


def test_every_int8_setting_is_in_the_layout_key(yolo, tmp_path, monkeypatch):
    parts = layout_variants(yolo, tmp_path, monkeypatch)
    keys = {name: key_for(p) for name, p in parts.items()}
    assert len(set(keys.values())) == len(keys), keys  # each change of a setting gives another key
    from enginekit.stages import int8

    base = int8.layout_parts(yolo.fp32, "images", "entropy", yolo.exclude, "fp32", (1, 3, 320, 320))
    assert keys["same"] == key_for(base) and yolo.layouts.find(base) is not None  # the fixture's is found by it


@pytest.mark.parametrize("change", [{"exclude_nodes": []}, {"high_precision": "fp16"},
                                    {"input_shape": (1, 3, 256, 256)}], ids=["exclude", "high-precision", "shape"])
def test_another_setting_never_reuses_a_kept_layout(yolo, tmp_path, monkeypatch, change):
    """The same graph and cache with one setting changed goes to ModelOpt (refused here), never to the layout."""
    args = {"exclude_nodes": yolo.exclude, **change}
    with monkeypatch.context() as mp:
        without_modelopt(mp)
        with pytest.raises(ModelOptRan):
            quantize_int8(yolo.fp32, tmp_path / "x.onnx", None, "images", calibration_cache=yolo.cache,
                          layouts=yolo.layouts, **args)
        args = {"exclude_nodes": yolo.exclude}  # and unchanged, the layout serves it
        assert quantize_int8(yolo.fp32, tmp_path / "y.onnx", None, "images", calibration_cache=yolo.cache,
                             layouts=yolo.layouts, **args).layout == "kept"


def test_modelopts_own_way_never_reuses_a_layout(yolo, tmp_path, monkeypatch):
    with monkeypatch.context() as mp:
        without_modelopt(mp)
        with pytest.raises(ModelOptRan):
            quantize_int8(yolo.fp32, tmp_path / "x.onnx", None, "images", exclude_nodes=yolo.exclude,
                          calibration_cache=yolo.cache, layouts=yolo.layouts, shortcuts=False)
        mp.setenv("ENGINEKIT_MODELOPT_SHORTCUTS", "0")
        with pytest.raises(ModelOptRan):
            quantize_int8(yolo.fp32, tmp_path / "x.onnx", None, "images", exclude_nodes=yolo.exclude,
                          calibration_cache=yolo.cache, layouts=yolo.layouts)


def test_a_layout_needs_every_tensor_it_quantizes(yolo, tmp_path, monkeypatch):
    scales = read_calibration_cache(yolo.cache)
    scales.pop(sorted(scales)[0])
    partial = write_calibration_cache(tmp_path / "partial.calib", scales, cache_header("entropy"))
    with monkeypatch.context() as mp:
        without_modelopt(mp)
        with pytest.raises(UsageError, match="lacks 1 of"):
            quantize_int8(yolo.fp32, tmp_path / "x.onnx", None, "images", exclude_nodes=yolo.exclude,
                          calibration_cache=partial, layouts=yolo.layouts)
    assert not (tmp_path / "x.onnx").exists()


def test_layout_of_another_format_is_not_used():
    from enginekit.stages.int8_layout import LAYOUT_FORMAT, LayoutInfo

    info = LayoutInfo(["w"], {"x_scale": "x"}, ["x"])
    assert LayoutInfo.from_json(info.to_json()) == info
    assert LayoutInfo.from_json({**info.to_json(), "layout_format": LAYOUT_FORMAT + 1}) is None


def test_bad_requests_are_one_line_usage_errors(yolo, tmp_path):
    def quantize(**kwargs):
        args = {"calibration": yolo.calibration, **kwargs}
        return quantize_int8(yolo.fp32, tmp_path / "x.onnx", args.pop("calibration"), "images", **args)

    with pytest.raises(UsageError, match="unknown calibration method 'minmax': choose entropy, max") as err:
        quantize(method="minmax")
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="needs calibration data or a calibration cache"):
        quantize(calibration=None)
    with pytest.raises(UsageError, match="made by entropy calibration, not max"):
        quantize(method="max", calibration_cache=yolo.cache)
    with pytest.raises(UsageError, match="has no input 'pixels'"):
        quantize_int8(yolo.fp32, tmp_path / "x.onnx", yolo.calibration, "pixels")
    with pytest.raises(UsageError, match="calibration data has shape"):
        quantize(calibration=yolo.calibration[:, :1])
    with pytest.raises(UsageError, match="bad exclude pattern"):
        quantize(exclude_nodes=["/model.(21/"])
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("content, message", [
    (None, "calibration cache not found"),
    (b"", "is not a calibration cache"),
    (b"\x89PNG\r\n\x1a\n\x00\x00binary", "cannot read calibration cache"),
    (b"tensor: 3c010204\n", "is not a calibration cache"),
    (b"TRT-100000-EntropyCalibration2\n", "holds no tensor scales"),
    (b"TRT-100000-EntropyCalibration2\nimages: 3c0102\n", "line 2: expected 'tensor: <8 hex digits>'"),
    (b"TRT-100000-EntropyCalibration2\nimages 3c010204\n", "line 2: expected"),
    (b"TRT-100000-EntropyCalibration2\nimages: 7fc00000\n", "the scale of 'images' is nan"),
    (b"TRT-100000-EntropyCalibration2\nimages: 00000000\n", "the scale of 'images' is 0.0"),
])
def test_garbled_cache_files_are_usage_errors(yolo, tmp_path, content, message):
    path = tmp_path / "bad.calib"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UsageError, match=re.escape(message)) as err:
        quantize_int8(yolo.fp32, tmp_path / "x.onnx", None, "images", calibration_cache=path)
    assert "\n" not in str(err.value)


# -- the cache file format, alone -------------------------------------------------------------


def test_cache_format_is_tensorrts(tmp_path):
    path = write_calibration_cache(tmp_path / "c.calib", {"b/out": 1 / 127, "a:in": 0.5}, cache_header("max"))
    assert path.read_text() == "TRT-100000-MinMaxCalibration\na:in: 3f000000\nb/out: 3c010204\n"
    assert read_calibration_cache(path) == {"a:in": 0.5, "b/out": struct.unpack(">f", struct.pack(">f", 1 / 127))[0]}
    assert CALIBRATION_METHODS == ("entropy", "max")


# -- Depth-Anything ---------------------------------------------------------------------------


def test_depth_int8_keeps_the_family_exclusions_out(workdir):
    """Plumbing of Depth-Anything's INT8: Q/DQ inserted, the family's excluded nodes take no quantized input,
    the output is finite and INT8 changed it. Not accuracy: a random Depth-Anything's depth spreads 5-8% around
    its mean (the map replaced by its mean keeps a cosine of 0.997), so no closeness figure on it could fail;
    INT8 depth is gated where it can fail, on the suite's trained depth model (test_dense_tasks.py)."""
    from enginekit.families import resolve

    fp32 = export(workdir, "depth", "1x3x224x224")
    batch = calibration_batch("depth", (224, 224))
    exclude = list(resolve("depth").int8_exclude)
    out = workdir / "depth.int8.onnx"
    report = quantize_int8(fp32, out, batch, "pixel_values", method="max", exclude_nodes=exclude)
    assert report.n_qdq_nodes > 100 and report.n_excluded > 0 and report.cache_written is None
    model = onnx.load(str(out))
    patterns = [re.compile(p) for p in exclude]
    excluded = [n for n in model.graph.node if any(p.match(n.name) for p in patterns)]
    made_by = producers(model)
    fed_by_dq = [(n.name, i) for n in excluded if n.op_type != "Shape"
                 for i in n.input if i in made_by and made_by[i].op_type == "DequantizeLinear"]
    assert excluded and fed_by_dq == []
    ref, got = ort_outputs(fp32, batch)["depth"], ort_outputs(out, batch)["depth"]
    assert np.isfinite(got).all() and not np.array_equal(ref, got)


# --- the ModelOpt / ONNX Runtime internals: one module, version-checked ---------------------


def test_installed_versions_are_the_ones_written_for():
    from enginekit.stages.modelopt import versions as modelopt_compat

    assert modelopt_compat.problem() is None, modelopt_compat.problem()


@pytest.mark.parametrize("versions, fragments", [
    ({"nvidia-modelopt": "0.48.0", "onnxruntime-gpu": "1.24.4"}, ["nvidia-modelopt 0.48.0", "0.47.x"]),
    ({"nvidia-modelopt": "0.47.0", "onnxruntime-gpu": "1.25.0"}, ["onnxruntime-gpu 1.25.0", "1.24.x or 1.31.x"]),
    ({"nvidia-modelopt": None, "onnxruntime": "1.31.1"}, ["nvidia-modelopt not installed"]),
])
def test_other_versions_are_refused_in_one_line(versions, fragments):
    from enginekit.stages.modelopt import versions as modelopt_compat

    reason = modelopt_compat.problem(versions, probe=False)
    assert reason is not None and "\n" not in reason
    for fragment in fragments:
        assert fragment in reason


def test_accepted_series_pass_without_probing():
    from enginekit.stages.modelopt import versions as modelopt_compat

    for ort in ("1.24.4", "1.31.1"):
        assert modelopt_compat.problem({"nvidia-modelopt": "0.47.0", "onnxruntime-gpu": ort}, probe=False) is None


def test_missing_internal_is_a_capability_error_before_any_work(yolo, tmp_path, monkeypatch):
    from enginekit.errors import CapabilityError
    from enginekit.stages.modelopt import versions as modelopt_compat
    from modelopt.onnx.quantization import ort_patching

    monkeypatch.delattr(ort_patching, "_select_tensors_to_calibrate")
    modelopt_compat._checked.cache_clear()
    try:
        with pytest.raises(CapabilityError, match=r"_select_tensors_to_calibrate.*nvidia-modelopt 0\.47"):
            quantize_int8(yolo.fp32, tmp_path / "out.onnx", yolo.calibration, yolo.input_name)
        assert not (tmp_path / "out.onnx").exists()
    finally:
        modelopt_compat._checked.cache_clear()


# --- the shortcuts (stages.modelopt.quantize_shortcuts): ModelOpt's graph, byte for byte --------------------


@pytest.mark.slow
def test_shortcut_graph_is_modelopts_own(yolo, tmp_path, monkeypatch):
    """The fixture's graph was calibrated with the shortcuts; ModelOpt's own pass from its cache writes the same bytes."""
    from enginekit.stages.modelopt import quantize as modelopt_compat

    shape_runs = []
    real = modelopt_compat._tensor_shapes
    monkeypatch.setattr(modelopt_compat, "_tensor_shapes", lambda *a, **k: shape_runs.append(1) or real(*a, **k))
    own = quantize_int8(yolo.fp32, tmp_path / "own.onnx", None, "images", exclude_nodes=yolo.exclude,
                        calibration_cache=yolo.cache, shortcuts=False)
    assert shape_runs == []
    assert (tmp_path / "own.onnx").read_bytes() == yolo.int8.read_bytes()
    fast = quantize_int8(yolo.fp32, tmp_path / "fast.onnx", None, "images", exclude_nodes=yolo.exclude,
                         calibration_cache=yolo.cache)
    assert shape_runs == [1]  # one shape run answered both of ModelOpt's inference probes (attention, MatMul)
    assert (tmp_path / "fast.onnx").read_bytes() == yolo.int8.read_bytes()
    assert own.n_qdq_nodes == fast.n_qdq_nodes > 100
    print(f"yolo12n int8 from cache: ModelOpt's own {own.seconds:.2f}s, shortcuts {fast.seconds:.2f}s")


@pytest.mark.slow
def test_task_model_shortcut_graph_is_modelopts_own(workdir, tmp_path):
    """A segmentation model: calibrated by ModelOpt's own pass, then from its cache with the shortcuts."""
    from enginekit.families import resolve

    fp32 = export(workdir, "yolo11n-seg", "1x3x320x320")
    exclude = list(resolve("yolo11n-seg").int8_exclude)
    cache = tmp_path / "seg.calib"
    own = quantize_int8(fp32, tmp_path / "own.onnx", calibration_batch("yolo11n-seg", (320, 320)), "images",
                        method="max", exclude_nodes=exclude, write_cache=cache, shortcuts=False)
    fast = quantize_int8(fp32, tmp_path / "fast.onnx", None, "images", method="max", exclude_nodes=exclude,
                         calibration_cache=cache)
    assert own.calibrated and not fast.calibrated
    assert (tmp_path / "fast.onnx").read_bytes() == (tmp_path / "own.onnx").read_bytes()
    assert own.n_qdq_nodes == fast.n_qdq_nodes > 100


def symmetric_int8_cases():
    rng = np.random.default_rng(0)
    yield from (rng.standard_normal(n).astype(np.float32) * scale
                for n in (1, 3, 27, 576) for scale in (1e-3, 0.05, 1.0, 300.0))
    yield np.zeros(9, np.float32)  # scale under float32's tiny: 1.0
    yield np.full(4, 1e-40, np.float32)  # denormal
    yield -np.abs(rng.standard_normal(16)).astype(np.float32)  # negative only
    yield np.abs(rng.standard_normal(16)).astype(np.float32)  # positive only
    yield np.float32([3.4e38, -1.0])  # near float32's max
    yield np.float32([np.nan, 1.0])  # left to the original
    yield np.float32([np.inf, 1.0])
    yield np.float32([])
    yield rng.standard_normal(8)  # float64: left to the original


@pytest.mark.parametrize("data", list(symmetric_int8_cases()), ids=lambda a: f"{a.dtype}x{a.size}")
def test_symmetric_int8_params_are_onnxruntimes(data):
    import onnx as onnx_

    from enginekit.stages.modelopt import quantize as modelopt_compat
    from onnxruntime.quantization.quant_utils import compute_data_quant_params

    fast = modelopt_compat._symmetric_int8_params(compute_data_quant_params)
    for qtype, symmetric in ((onnx_.TensorProto.INT8, True), (onnx_.TensorProto.INT8, False),
                             (onnx_.TensorProto.UINT8, False)):
        assert outcome(fast, data, qtype, symmetric) == outcome(compute_data_quant_params, data, qtype, symmetric)


def outcome(function, *args):
    """(dtype, shape, bytes) of each returned array, or the exception raised (NaN data makes ORT assert)."""
    try:
        with np.errstate(all="ignore"):
            return [(a.dtype, a.shape, a.tobytes()) for a in function(*args)]
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return type(exc).__name__, str(exc)


def test_graph_helpers_are_onnxruntimes():
    import copy

    from enginekit.stages.modelopt import quantize as modelopt_compat
    from onnxruntime.quantization.onnx_model import ONNXModel
    from onnxruntime.quantization.quant_utils import find_by_name

    nodes = [onnx.helper.make_node("Add", ["a", "a"], ["b"], name="n0"),
             onnx.helper.make_node("Mul", ["b", "c"], ["d"], name="n1"),
             onnx.helper.make_node("Relu", ["a"], ["e"], name="n2")]
    graph = onnx.helper.make_graph(nodes, "g", [], [], [onnx.helper.make_tensor("c", 1, [], [1.0]),
                                                        onnx.helper.make_tensor("c", 1, [], [2.0])])
    model = onnx.helper.make_model(graph)
    for name in ("a", "b", "zz"):
        want, got = ONNXModel(copy.deepcopy(model)), ONNXModel(copy.deepcopy(model))
        want.replace_input_of_all_nodes(name, "new")
        modelopt_compat._replace_input_of_all_nodes(got, name, "new")
        assert got.model == want.model
    for name in ("c", "n1", "missing"):
        for items in (model.graph.initializer, model.graph.node):
            assert modelopt_compat._find_by_name(name, items) is find_by_name(name, items) or \
                modelopt_compat._find_by_name(name, items) == find_by_name(name, items)
