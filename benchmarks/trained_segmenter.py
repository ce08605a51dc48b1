"""A trained segmenter of the DeepLabV3 family, its FP16 and INT8 verdicts against mask labels, measured.

    .venv/bin/python benchmarks/trained_segmenter.py [--out DIR] [--methods max,entropy]

The suite's segmenter (tests/trained_segmenter.py: torchvision's ``lraspp_mobilenet_v3_large``, 4 classes,
trained on generated composites at 256x256, cached in ``~/.cache/enginekit-tests``; trained here where the
cache lacks it). Then, as a user runs it, per precision (and calibration method for INT8)::

    enginekit verify torchvision:lraspp_mobilenet_v3_large -w model.pth --classes 4 --size 256x256 \\
        --data check/data.yaml --precision P [--calib-data calib --calib-method M] --report R

on held-out composites (non-square: 256x352) that neither training nor calibration saw; and two tampered FP32
graphs (classes 1 and 2 exchanged in both classifier convs; a tenth of one backbone conv's output channels
x -3), verified with ``--reference`` (each must fail). Writes runs.json in ``--out``; prints one JSON line per
run (its exit code, seconds and the report's figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from trained_segmenter import CALIB, CHECK, MODEL, NAMES, SIZE, held_out_miou, train_seconds, trained, write_split  # noqa: E402

def verify(weights: Path, check: Path, calib: Path, precision: str, method: str | None, report: Path,
           extra=()) -> dict:
    cmd = [sys.executable, "-m", "enginekit", "verify", MODEL, "-w", str(weights), "--classes", str(len(NAMES)),
           "--size", "256x256", "--data", str(check / "data.yaml"), "--images", str(check / "images" / "val"),
           "--precision", precision, "--report", str(report), *extra]
    if method:
        cmd += ["--calib-data", str(calib / "images" / "val"), "--calib-count", str(CALIB["count"]),
                "--calib-method", method]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = {"cmd": " ".join(cmd[2:]), "code": proc.returncode, "seconds": round(time.time() - t0, 1),
           "stderr_tail": proc.stderr[-3000:]}
    path = report / "report.json"
    if path.is_file():
        out["report"] = json.loads(path.read_text())
    return out


def tampered_graphs(weights: Path, out: Path) -> dict[str, Path]:
    """The FP32 export, and two copies of it tampered (see the module's docstring)."""
    import onnx
    from onnx import numpy_helper

    from enginekit import api

    exported = api.export(MODEL, weights=weights, declared={"classes": len(NAMES), "size": "x".join(map(str, SIZE))},
                          output=out / "seg.onnx", quiet=True)
    graphs = {"untouched export": exported.output}
    model = onnx.load(str(exported.output))
    for init in model.graph.initializer:  # classes 1 and 2 exchanged where a tensor has one row per class
        arr = numpy_helper.to_array(init)
        if arr.ndim in (1, 4) and arr.shape[0] == len(NAMES):
            arr = arr.copy()
            arr[[1, 2]] = arr[[2, 1]]
            init.CopyFrom(numpy_helper.from_array(arr, init.name))
    onnx.save(model, str(out / "swapped.onnx"))
    graphs["classes 1 and 2 exchanged"] = out / "swapped.onnx"
    model = onnx.load(str(exported.output))
    convs = [i for i in model.graph.initializer if len(i.dims) == 4 and i.dims[0] >= 100]
    target = max(convs, key=lambda i: int(np.prod(i.dims)))
    arr = numpy_helper.to_array(target).copy()
    arr[: arr.shape[0] // 10] *= -3.0
    target.CopyFrom(numpy_helper.from_array(arr, target.name))
    onnx.save(model, str(out / "scaled.onnx"))
    graphs[f"a tenth of {target.name}'s output channels x -3"] = out / "scaled.onnx"
    return graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/trained_segmenter"))
    parser.add_argument("--methods", default="max,entropy")
    parser.add_argument("--only-train", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    weights = trained(lambda s: print(s, file=sys.stderr, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    check = write_split(args.out / "check", CHECK, True)
    calib = write_split(args.out / "calib", CALIB, False)
    fp32 = held_out_miou(weights, check)
    print(f"FP32 PyTorch mIoU on {CHECK['count']} held-out composites ({CHECK['hw'][0]}x{CHECK['hw'][1]}): {fp32:.4f}"
          f" (trained in {train_seconds(weights):.0f} s)", flush=True)
    if args.only_train:
        return
    runs = [("fp16", None)] + [("int8", m) for m in args.methods.split(",") if m]
    rows = []
    for precision, method in runs:
        r = verify(weights, check, calib, precision, method, args.out / f"report-{precision}-{method or 'none'}")
        rows.append({"precision": precision, "method": method, **r})
        print(json.dumps({k: v for k, v in r.items() if k != "report"})[:1500], file=sys.stderr, flush=True)
    for i, (what, graph) in enumerate(tampered_graphs(weights, args.out).items()):
        cmd = [sys.executable, "-m", "enginekit", "verify", str(graph), "--reference", str(weights), "--classes",
               str(len(NAMES)), "--size", "x".join(map(str, SIZE)), "--data", str(check / "data.yaml"),
               "--report", str(args.out / f"report-tampered-{i}")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        report = args.out / f"report-tampered-{i}" / "report.json"
        entry = json.loads(report.read_text())["entries"][0] if report.is_file() else {}
        row = {"tampered": what, "code": proc.returncode, "failures": entry.get("failures"),
               "ground_truth": (entry.get("artifacts") or [{}])[-1].get("ground_truth")}
        rows.append(row)
        print(json.dumps(row, default=str)[:1500], file=sys.stderr, flush=True)
    (args.out / "runs.json").write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
