"""Pipeline benchmarks: the speed targets of export, build and verify, measured, not asserted.

    .venv/bin/python benchmarks/pipeline.py [--section help,export,ort,build,int8,verify] [--json out.json]

Each section runs in fresh caches (temporary folders) and, where start-up matters, in fresh
processes, as a user would meet it. Timings are medians of repeated runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
os.environ.setdefault("YOLO_CONFIG_DIR", str(Path(tempfile.gettempdir()) / "enginekit-bench-ultralytics"))

ENGINEKIT = [sys.executable, "-m", "enginekit"]
YOLO_PROFILE = "1x3x640x640:8x3x640x640:16x3x640x640"
DEPTH_PROFILE = "1x3x392x392:1x3x518x518:2x3x518x518"
rows: list[dict] = []


def record(section: str, what: str, value: float, unit: str, note: str = "") -> None:
    rows.append({"section": section, "what": what, "value": round(value, 4), "unit": unit, "note": note})
    print(f"{section:8} {what:58} {value:10.3f} {unit:4} {note}", flush=True)


def wall(cmd: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env={**os.environ, **(env or {})}, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def bench_help() -> None:
    times = [wall([*ENGINEKIT, "--help"]) for _ in range(7)]
    record("help", "enginekit --help wall time (median of 7)", statistics.median(times), "s", "goal < 0.5 s")


def bench_export(repeats: int = 3) -> None:
    """enginekit export+simplify vs Ultralytics' export(format="onnx", simplify=True), same process."""
    from ultralytics import YOLO

    from enginekit.cache import Cache
    from enginekit.pipeline import ModelRequest, Stages

    ours, theirs = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            pipe = Stages(ModelRequest("yolo12n", random_init=True), Cache(Path(tmp) / "c"), quiet=True)
            pipe.simplify(pipe.export((1, 3, 640, 640), 18), (1, 3, 640, 640))
            ours.append(time.perf_counter() - start)
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                start = time.perf_counter()
                YOLO("yolo12n.yaml").export(format="onnx", simplify=True, dynamic=True, verbose=False)
                theirs.append(time.perf_counter() - start)
            finally:
                os.chdir(cwd)
    o, t = statistics.median(ours), statistics.median(theirs)
    record("export", "enginekit load+export+simplify(+equality check) yolo12n 640", o, "s")
    record("export", "Ultralytics YOLO('yolo12n.yaml').export(onnx, simplify)", t, "s")
    record("export", "ratio enginekit / Ultralytics", o / t, "x", "goal <= 1")


def bench_ort(runs: int = 40) -> None:
    """ONNX Runtime CPU latency: enginekit's yolo12n graph vs Ultralytics' graph, same input."""
    import numpy as np
    import onnxruntime as ort
    from ultralytics import YOLO

    from enginekit.cache import Cache
    from enginekit.pipeline import ModelRequest, Stages

    with tempfile.TemporaryDirectory() as tmp:
        pipe = Stages(ModelRequest("yolo12n", random_init=True), Cache(Path(tmp) / "c"), quiet=True)
        ours = pipe.simplify(pipe.export((1, 3, 640, 640), 18), (1, 3, 640, 640)).path
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            theirs = Path(tmp) / YOLO("yolo12n.yaml").export(format="onnx", simplify=True, dynamic=True, verbose=False)
        finally:
            os.chdir(cwd)
        x = np.random.default_rng(0).random((1, 3, 640, 640), dtype=np.float32)
        sessions = {name: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                    for name, p in (("enginekit", ours), ("ultralytics", theirs))}
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for _ in range(5):
            for s in sessions.values():
                s.run(None, {"images": x})
        for _ in range(runs):  # alternate so load on the machine hits both alike
            for name, s in sessions.items():
                start = time.perf_counter()
                s.run(None, {"images": x})
                times[name].append(time.perf_counter() - start)
    o, t = statistics.median(times["enginekit"]) * 1e3, statistics.median(times["ultralytics"]) * 1e3
    record("ort", "ONNX Runtime CPU p50, enginekit yolo12n graph (batch 1, 640)", o, "ms")
    record("ort", "ONNX Runtime CPU p50, Ultralytics yolo12n graph", t, "ms")
    record("ort", "ratio enginekit / Ultralytics", o / t, "x", "goal <= 1")


def stage_times(cache_root: Path, model: str, profile: str, precision: str) -> None:
    """Cold build of one engine, then the same build again (cache hit), in fresh processes."""
    env = {"ENGINEKIT_CACHE": str(cache_root)}
    args = [*ENGINEKIT, "build", model, "--random-init", "--precision", precision, "--profile", profile]
    cold = wall(args, env)
    hits = [wall(args, env) for _ in range(3)]
    hit = statistics.median(hits)
    record("build", f"{model} {precision} cold build (all stages, parity)", cold, "s")
    record("build", f"{model} {precision} cache-hit build (median of 3)", hit, "s", "goal < 1.5 s")
    record("build", f"{model} {precision} hit / cold", hit / cold, "x")
    for kind in ("onnx-export", "onnx-simplify", "onnx-fp16", "onnx-int8", "engine"):
        for manifest in sorted((cache_root / kind).glob("*/manifest.json")):
            m = json.loads(manifest.read_text())
            if m.get("subject", "").startswith(model.replace("depth", "depth-anything-v2-small")):
                seconds = m.get("seconds")  # whole stage; the engine's includes its parity check
                if seconds is not None:
                    record("build", f"  stage {kind} ({m['subject']}, {precision})", seconds, "s")


def bench_build() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stage_times(Path(tmp) / "yolo", "yolo12n", YOLO_PROFILE, "fp16")
        stage_times(Path(tmp) / "depth", "depth", DEPTH_PROFILE, "fp16")
        stage_times(Path(tmp) / "yolo8", "yolo12n", YOLO_PROFILE, "int8")
        stage_times(Path(tmp) / "depth8", "depth", DEPTH_PROFILE, "int8")


def bench_int8() -> None:
    """INT8 quantization with a calibration-cache hit vs calibrating afresh (fresh caches)."""
    with tempfile.TemporaryDirectory() as tmp:
        calib = Path(tmp) / "yolo.calib"
        for model, profile in (("yolo12n", YOLO_PROFILE), ("depth", DEPTH_PROFILE)):
            calib.unlink(missing_ok=True)
            results = {}
            for label, root in (("calibrating", "a"), ("from calibration cache", "b")):
                env = {"ENGINEKIT_CACHE": str(Path(tmp) / f"{model}-{root}")}
                wall([*ENGINEKIT, "build", model, "--random-init", "--precision", "int8", "--profile", profile,
                      "--calib-cache", str(calib), "--no-verify"], env)
                (manifest,) = (Path(tmp) / f"{model}-{root}" / "onnx-int8").glob("*/manifest.json")
                results[label] = json.loads(manifest.read_text())["seconds"]
                record("int8", f"{model} int8 stage, {label}", results[label], "s")
            record("int8", f"{model} ratio cache hit / calibrating", results["from calibration cache"] / results["calibrating"], "x")


def bench_verify() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"ENGINEKIT_CACHE": str(Path(tmp) / "c")}
        for model, profile in (("yolo12n", YOLO_PROFILE), ("depth", DEPTH_PROFILE)):
            build = [*ENGINEKIT, "build", model, "--random-init", "--precision", "fp16", "--profile", profile]
            wall(build, env)
            verify = [*ENGINEKIT, "verify", model, "--random-init", "--precision", "fp16", "--profile", profile]
            first, second = wall(verify, env), wall(verify, env)
            record("verify", f"{model} fp16 verify, references computed", first, "s")
            record("verify", f"{model} fp16 verify, references stored (no PyTorch forward)", second, "s")


SECTIONS = {"help": bench_help, "export": bench_export, "ort": bench_ort, "build": bench_build,
            "int8": bench_int8, "verify": bench_verify}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", default=",".join(SECTIONS), help="comma-separated: " + ",".join(SECTIONS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}", flush=True)
    for name in args.section.split(","):
        SECTIONS[name.strip()]()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
