"""A checkpoint Ultralytics trained quantization-aware (``train(..., quantize=8)``): exported as its Q/DQ graph with the
trained ranges, built as INT8 with no calibration, judged against its own quantized PyTorch forward, and run.

The checkpoint is the suite's trained detector fine-tuned by Ultralytics' trainer with ``quantize=8``
(``trained_detector.qat_detector``, cached): the model without quantizers, ModelOpt's state beside it, as 8.4 writes it.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error

IMGSZ = "160"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """qat.pt, plain.pt (the same file without its quantization state: the FP32 weights a PTQ would start from),
    check/ (16 generated images), and a cache of its own."""
    import torch

    from trained_detector import qat_detector, write_held_out_images

    root = tmp_path_factory.mktemp("qat")
    qat = qat_detector()
    (root / "qat.pt").write_bytes(qat.read_bytes())
    ckpt = torch.load(qat, weights_only=False)  # the suite's own file
    ckpt.pop("modelopt")
    torch.save(ckpt, root / "plain.pt")
    write_held_out_images(root / "check", count=16, size=320, seed=777)
    return root


def _env(world) -> dict:
    return {"ENGINEKIT_CACHE": str(world / "cache")}


def _ops(path: Path) -> collections.Counter:
    import onnx

    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def test_the_checkpoint_is_one_the_trainer_wrote_quantization_aware(world):
    import torch

    ckpt = torch.load(world / "qat.pt", weights_only=False)
    assert ckpt.get("modelopt") and {"modelopt", "ranges"} <= set(ckpt["modelopt"]), sorted(ckpt)
    assert ckpt["train_args"].get("quantize") == 8
    assert any("quantizer" in k for k in ckpt["modelopt"]["ranges"])


def test_export_writes_its_qdq_graph_judged_as_int8(world, run_cli):
    """The graph carries the trained ranges (Q/DQ, no calibration) and is judged with the INT8 gates against the
    quantized PyTorch forward; the same weights without the quantization state export a float graph whose outputs
    differ: the export follows the checkpoint's quantization, it does not drop it."""
    from enginekit.onnx import runtime
    from enginekit.onnx.graph import get_metadata, load_model

    qat = run_cli("export", "qat.pt", "--imgsz", IMGSZ, "-o", "qat.onnx", cwd=world, env=_env(world))
    assert qat.code == 0, qat.stderr[-3000:]
    text = " ".join(qat.stderr.split())
    assert "trained quantization-aware (QAT)" in text and "parity int8" in text, text[-2000:]
    ops = _ops(world / "qat.onnx")
    assert ops["QuantizeLinear"] >= 50 and ops["DequantizeLinear"] >= 50, ops
    assert get_metadata(load_model(world / "qat.onnx")).get("quantization") == "qat-int8"
    plain = run_cli("export", "plain.pt", "--imgsz", IMGSZ, "-o", "plain.onnx", cwd=world, env=_env(world))
    assert plain.code == 0, plain.stderr[-3000:]
    assert _ops(world / "plain.onnx")["QuantizeLinear"] == 0
    x = np.random.default_rng(0).uniform(0, 1, (1, 3, 160, 160)).astype(np.float32)
    outs = [runtime.run(runtime.session(world / f), {"images": x}) for f in ("qat.onnx", "plain.onnx")]
    a, b = (next(iter(o.values())) for o in outs)
    assert np.linalg.norm(a - b) / np.linalg.norm(b) > 1e-3  # the Q/DQ ranges change what it computes


def test_build_int8_needs_no_calibration_and_refuses_what_does_not_apply(world, run_cli):
    built = run_cli("build", "qat.pt", "--imgsz", IMGSZ, "--precision", "int8", cwd=world, env=_env(world))
    assert built.code == 0, built.stderr[-3000:]
    text = " ".join(built.stderr.split())
    assert "no calibration" in text and "calibrated on the embedded photographs" not in text, text[-2000:]
    engine = Path(built.stdout.strip().splitlines()[-1])
    manifest = json.loads((engine.parent / "manifest.json").read_text())
    assert manifest["precision"]["mode"] == "int8" and manifest["precision"]["method"] == "qat", manifest["precision"]
    assert manifest["precision"].get("calibration") is None
    assert manifest["parity"]["passed"] is True
    fp32 = run_cli("build", "qat.pt", "--imgsz", IMGSZ, cwd=world, env=_env(world))
    assert_one_line_error(fp32, 2, "trained quantization-aware", "--precision int8")
    calib = run_cli("build", "qat.pt", "--imgsz", IMGSZ, "--precision", "int8", "--calib-data", "check", cwd=world,
                    env=_env(world))
    assert_one_line_error(calib, 2, "trained, not calibrated", "--calib-data")


def test_verify_judges_every_graph_of_its_chain_as_int8_and_predict_runs_it(world, run_cli):
    verified = run_cli("verify", "qat.pt", "--imgsz", IMGSZ, "--precision", "int8", "--images", "check",
                       "--image-count", "16", "--report", "verified", cwd=world, env=_env(world))
    assert verified.code == 0, verified.stderr[-3000:]
    assert "calibrating" not in verified.stderr, verified.stderr[-2000:]  # its ranges are trained: nothing calibrates
    report = json.loads((world / "verified" / "report.json").read_text())
    graphs = [a for e in report["entries"] for a in e["artifacts"] if a["kind"] == "onnx"]
    assert graphs and all(a["precision"] == "int8" and a["ran"] for a in graphs), graphs
    assert all(a["task"]["reference_detections"] >= 40 for a in graphs)  # the gate compared detections
    shown = run_cli("predict", "qat.pt", "check/shapes_00.png", "--imgsz", IMGSZ, "--precision", "int8", "--json",
                    cwd=world, env=_env(world))
    assert shown.code == 0, shown.stderr[-3000:]
    frames = json.loads(shown.stdout)["frames"]  # stdout is the document alone: ModelOpt's own prints kept off it
    assert len(frames) == 1 and frames[0]["results"]["qat"]["detections"], frames
