"""Pipeline benchmarks: the speed targets of export, build and verify, measured, not asserted.

    .venv/bin/python benchmarks/pipeline.py [--section help,cold,export,ort,build,int8,verify,hits]
                                            [--quick] [--repeats N] [--models depth,yolo12n] [--json out.json]

Each section runs in fresh caches (temporary folders) and, where start-up matters, in fresh
processes, as a user would meet it. Timings are medians of repeated runs; the machine's load is
printed beside them (compare figures only from a quiet machine, or within one run). Where other
work shares the machine, the CPU seconds (user + system, all threads) printed beside a wall time
are the steadier figure: a step that keeps the machine busy takes at most about that long alone.

cold    FP16 export of Depth-Anything-V2-small (518x518) and yolo12n (640x640) from an empty cache:
        the command's wall time and its fp16 stage (ModelOpt AutoCast), with enginekit's AutoCast
        shortcuts and ModelOpt's own way ($ENGINEKIT_MODELOPT_SHORTCUTS=0), and whether both wrote
        the same graph.
int8    The INT8 stage calibrating afresh, then from the calibration cache that run wrote: in an empty
        engine cache (ModelOpt's pass, with the shortcuts and ModelOpt's own way), and with the Q/DQ
        layout the calibrating run kept (no ModelOpt): seconds, the speed-ups, whether the graphs are equal.
verify  verify's wall time with the references computed, then stored, and its verdict as the exit
        code gives it: a check that compares nothing (random YOLO weights) is reported as such.
hits    what a cache hit costs, cold then warm: a second identical export (no model load, no parity run:
        its stored verdict), enginekit.load() of a cached artifact after imports (CPU, ONNX Runtime), and
        `make nightly` over the shipped recipes (--quick: one recipe) with nothing changed.
--quick A small, fast configuration of the same code (tests/test_bench_pipeline.py runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
os.environ.setdefault("YOLO_CONFIG_DIR", str(Path(tempfile.gettempdir()) / "enginekit-bench-ultralytics"))

ENGINEKIT = [sys.executable, "-m", "enginekit"]
YOLO_PROFILE = "1x3x640x640:8x3x640x640:16x3x640x640"
DEPTH_PROFILE = "1x3x392x392:1x3x518x518:2x3x518x518"
SHORTCUTS_ENV = "ENGINEKIT_MODELOPT_SHORTCUTS"  # enginekit.stages.modelopt reads it
rows: list[dict] = []


@dataclass
class Settings:
    """What each section measures; --quick swaps in small inputs and single runs."""

    repeats: int = 3
    help_runs: int = 7
    cold: tuple[tuple[str, str], ...] = (("depth", "1x3x518x518"), ("yolo12n", "1x3x640x640"))
    cold_compare: bool = True  # also ModelOpt's own way
    int8: tuple[tuple[str, str], ...] = (("yolo12n", "1x3x640x640"), ("depth", "1x3x518x518"))
    verify: tuple[tuple[str, str], ...] = (("yolo12n", YOLO_PROFILE), ("depth", DEPTH_PROFILE))
    verify_onnx: bool = False  # verify an exported ONNX file instead of building an engine first
    hits_export: tuple[str, str] = ("yolov8n", "1x3x320x320")
    hits_load: str = "yolo12n"
    nightly: tuple[str, ...] = ()  # recipes (names) of the nightly run; () all the shipped ones


QUICK = Settings(repeats=1, help_runs=3, cold=(("yolo12n", "1x3x160x160"),), cold_compare=False,
                 int8=(("yolo12n", "1x3x160x160"),), verify=(("yolo12n", "1x3x160x160"),), verify_onnx=True,
                 hits_export=("yolo12n", "1x3x160x160"), nightly=("yolo12n",))


class BenchError(Exception):
    """A step the benchmark needs failed: one line, no traceback."""


def record(section: str, what: str, value: float, unit: str, note: str = "") -> None:
    rows.append({"section": section, "what": what, "value": round(value, 4), "unit": unit, "note": note})
    print(f"{section:8} {what:62} {value:10.3f} {unit:4} {note}", flush=True)


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


@dataclass
class Ran:
    seconds: float
    returncode: int
    last_line: str  # the last line the command printed to stderr (its error line, when it failed)
    cpu: float = 0.0  # user + system seconds of the command and everything it waited for
    stderr: str = ""  # all it printed there


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], env: dict | None = None) -> Ran:
    """Run ``cmd`` in a fresh process; its exit code is returned, not judged."""
    start, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return Ran(time.perf_counter() - start, done.returncode, lines[-1] if lines else "", children_cpu() - cpu,
               done.stderr)


def checked(cmd: list[str], env: dict | None = None) -> Ran:
    """A step that must succeed; BenchError naming the step and its error line otherwise."""
    ran = run(cmd, env)
    if ran.returncode != 0:
        shown = " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd))
        raise BenchError(f"{shown} exited {ran.returncode}: {ran.last_line}")
    return ran


def wall(cmd: list[str], env: dict | None = None) -> float:
    """Seconds of a step that must succeed (see ``checked``)."""
    return checked(cmd, env).seconds


def cpu_note(seconds: list[float]) -> str:
    return f"cpu {statistics.median(seconds):.1f} s"


def manifest(cache_root: Path, kind: str) -> dict:
    found = sorted((cache_root / kind).glob("*/manifest.json"))
    if len(found) != 1:
        raise BenchError(f"expected one {kind} entry in {cache_root}, found {len(found)}")
    return json.loads(found[0].read_text())


def bench_help(s: Settings) -> None:
    times = [wall([*ENGINEKIT, "--help"]) for _ in range(s.help_runs)]
    record("help", f"enginekit --help wall time (median of {s.help_runs})", statistics.median(times), "s", "goal < 0.5 s")


def bench_cold(s: Settings) -> None:
    """FP16 export from an empty cache, in fresh processes: the command, and its fp16 stage."""
    modes = (("shortcuts", {}), ("modelopt", {SHORTCUTS_ENV: "0"})) if s.cold_compare else (("shortcuts", {}),)
    for model, shape in s.cold:
        walls: dict[str, list[float]] = {m: [] for m, _ in modes}
        cpus: dict[str, list[float]] = {m: [] for m, _ in modes}
        stages: dict[str, list[float]] = {m: [] for m, _ in modes}
        graphs: dict[str, set[str]] = {m: set() for m, _ in modes}
        for _ in range(s.repeats):
            for mode, env in modes:  # alternate, so load on the machine hits both alike
                with tempfile.TemporaryDirectory() as tmp:
                    root = Path(tmp) / "cache"
                    ran = checked([*ENGINEKIT, "export", model, "--random-init", "--input", shape, "--fp16",
                                   "-o", str(Path(tmp) / "out.onnx")], {"ENGINEKIT_CACHE": str(root), **env})
                    walls[mode].append(ran.seconds)
                    cpus[mode].append(ran.cpu)
                    fp16 = manifest(root, "onnx-fp16")
                    stages[mode].append(fp16["seconds"])
                    graphs[mode].add(fp16["files"]["model.onnx"]["sha256"])
        for mode, _ in modes:
            how = "enginekit's AutoCast shortcuts" if mode == "shortcuts" else "ModelOpt's own AutoCast"
            n = len(stages[mode])
            goal = "goal <= 20 s" if model == "depth" and mode == "shortcuts" else ""
            record("cold", f"{model} {shape} fp16 stage, {how} (median of {n})", statistics.median(stages[mode]), "s",
                   f"{goal} {load()}".strip())
            record("cold", f"{model} {shape} export --fp16 wall, {how}", statistics.median(walls[mode]), "s",
                   f"load, export, simplify, fp16, parity; {cpu_note(cpus[mode])}")
        if s.cold_compare:
            same = len(graphs["shortcuts"] | graphs["modelopt"]) == 1
            record("cold", f"{model} fp16 stage speed-up (ModelOpt's own / shortcuts)",
                   statistics.median(stages["modelopt"]) / statistics.median(stages["shortcuts"]), "x",
                   f"same graph: {'yes' if same else 'NO'}")


def bench_export(s: Settings) -> None:
    """enginekit export+simplify vs Ultralytics' export(format="onnx", simplify=True), same process."""
    from ultralytics import YOLO

    from enginekit.cache import Cache
    from enginekit.pipeline import ModelRequest, Stages

    ours, theirs = [], []
    for _ in range(s.repeats):
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


def bench_ort(s: Settings, runs: int = 40) -> None:
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
            for sess in sessions.values():
                sess.run(None, {"images": x})
        for _ in range(runs):  # alternate so load on the machine hits both alike
            for name, sess in sessions.items():
                start = time.perf_counter()
                sess.run(None, {"images": x})
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
        for found in sorted((cache_root / kind).glob("*/manifest.json")):
            m = json.loads(found.read_text())
            if m.get("subject", "").startswith(model.replace("depth", "depth-anything-v2-small")):
                seconds = m.get("seconds")  # whole stage; the engine's includes its parity check
                if seconds is not None:
                    record("build", f"  stage {kind} ({m['subject']}, {precision})", seconds, "s")


def bench_build(s: Settings) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stage_times(Path(tmp) / "yolo", "yolo12n", YOLO_PROFILE, "fp16")
        stage_times(Path(tmp) / "depth", "depth", DEPTH_PROFILE, "fp16")
        stage_times(Path(tmp) / "yolo8", "yolo12n", YOLO_PROFILE, "int8")
        stage_times(Path(tmp) / "depth8", "depth", DEPTH_PROFILE, "int8")


# The INT8 stage alone, as the Python API runs it in a fresh process (no engine is built after it):
# export, simplify, then int8 with the family's calibration method at the shape given, reading the
# calibration cache file when it exists, else calibrating and writing it.
INT8_STAGE = """
import json, resource, sys
from pathlib import Path
from enginekit.cache import Cache
from enginekit.calibration import CalibrationData
from enginekit.pipeline import ModelRequest, Stages
model, shape, root, calib = sys.argv[1], tuple(int(d) for d in sys.argv[2].split("x")), Path(sys.argv[3]), Path(sys.argv[4])
pipe = Stages(ModelRequest(model, random_init=True), Cache(root), quiet=True)
fp32 = pipe.simplify(pipe.export(shape, 18), shape)
method = getattr(pipe.adapter, "int8_calibration", None) or "entropy"
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
before = cpu()
int8 = pipe.int8(fp32, shape, CalibrationData(None), method=method, calibration_cache=calib)
print(json.dumps({"method": method, "seconds": int8.manifest["seconds"], "cpu": cpu() - before, "calibrated": int8.manifest["calibrated"],
                  "layout": int8.manifest.get("qdq_layout"), "modelopt": "modelopt" in sys.modules,
                  "sha256": int8.manifest["files"]["model.onnx"]["sha256"]}))
"""


def int8_stage(model: str, shape: str, root: Path, calib: Path, env: dict | None = None) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", INT8_STAGE, model, shape, str(root), str(calib)],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise BenchError(f"int8 stage of {model} {shape} exited {done.returncode}: {lines[-1] if lines else ''}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall"] = time.perf_counter() - start
    return result


def bench_int8(s: Settings) -> None:
    """INT8 stage calibrating afresh vs from the calibration cache that run wrote.

    From the calibration cache in an empty engine cache (the file carried to another machine): ModelOpt's
    pass, with enginekit's shortcuts (what a build runs) and ModelOpt's own way (what it ran before them).
    Then in the calibrating run's engine cache without its INT8 entry, where the Q/DQ layout that run
    kept rebuilds the graph without ModelOpt (as for another calibration cache of the same graph and
    settings). Every graph is compared with the first.
    """
    modes = (("shortcuts", {}), ("modelopt", {SHORTCUTS_ENV: "0"})) if s.cold_compare else (("shortcuts", {}),)
    for model, shape in s.int8:
        with tempfile.TemporaryDirectory() as tmp:
            calib = Path(tmp) / f"{model}.calib"
            calibrating: dict[str, float] = {}
            calibrating_cpu: dict[str, float] = {}
            graphs: set[str] = set()
            for mode, env in modes:
                calib.unlink(missing_ok=True)
                fresh = int8_stage(model, shape, Path(tmp) / f"calibrating-{mode}", calib, env)
                if not fresh["calibrated"] or not calib.is_file():
                    raise BenchError(f"the first INT8 run of {model} did not calibrate and write {calib.name}")
                calibrating[mode] = fresh["seconds"]
                calibrating_cpu[mode] = fresh["cpu"]
                graphs.add(fresh["sha256"])
            hits: dict[str, list[float]] = {mode: [] for mode, _ in (*modes, ("layout", {}))}
            hit_cpus: dict[str, list[float]] = {mode: [] for mode in hits}
            for i in range(s.repeats):
                for mode, env in modes:  # alternate, so load on the machine hits all alike
                    hit = int8_stage(model, shape, Path(tmp) / f"{mode}{i}", calib, env)
                    if hit["calibrated"]:
                        raise BenchError(f"the INT8 run of {model} from {calib.name} calibrated again")
                    hits[mode].append(hit["seconds"])
                    hit_cpus[mode].append(hit["cpu"])
                    graphs.add(hit["sha256"])
                # the calibrating run's engine cache less its INT8 entry: the calibration and the layout stay
                kept = Path(tmp) / f"layout{i}"
                shutil.copytree(Path(tmp) / "calibrating-shortcuts", kept)
                shutil.rmtree(kept / "onnx-int8")
                hit = int8_stage(model, shape, kept, calib)
                if hit["calibrated"] or hit["layout"] != "kept" or hit["modelopt"]:
                    raise BenchError(f"the INT8 run of {model} with its Q/DQ layout kept did not rebuild it without "
                                     f"ModelOpt (layout {hit['layout']}, ModelOpt imported: {hit['modelopt']})")
                hits["layout"].append(hit["seconds"])
                hit_cpus["layout"].append(hit["cpu"])
                graphs.add(hit["sha256"])
            what = f"{model} {shape} int8 stage ({fresh['method']})"
            same = f"same graph in all {len(modes) * (1 + s.repeats) + s.repeats} runs: {'yes' if len(graphs) == 1 else 'NO'}"
            for mode, _ in modes:
                how = "shortcuts" if mode == "shortcuts" else "ModelOpt's own way"
                record("int8", f"{what}, calibrating, {how}", calibrating[mode], "s",
                       f"cpu {calibrating_cpu[mode]:.1f} s, {load()}")
            for mode in hits:
                how = {"shortcuts": "empty engine cache, ModelOpt's pass with shortcuts",
                       "modelopt": "empty engine cache, ModelOpt's own way",
                       "layout": "Q/DQ layout kept, no ModelOpt"}[mode]
                base = "modelopt" if mode == "modelopt" else "shortcuts"
                hit, hit_cpu = statistics.median(hits[mode]), statistics.median(hit_cpus[mode])
                record("int8", f"{what}, from calibration cache, {how} (median of {s.repeats})", hit, "s",
                       f"cpu {hit_cpu:.1f} s, {load()}")
                record("int8", f"{model} speed-up calibrating / cache hit, {how}", calibrating[base] / hit, "x",
                       f"{'goal >= 5x' if mode == 'layout' else 'before' if mode == 'modelopt' else 'no layout'}; "
                       f"in cpu seconds {calibrating_cpu[base] / hit_cpu:.2f}x")
            record("int8", f"{model} graphs from the calibration cache equal the calibrated one", float(len(graphs) == 1),
                   "bool", same)


def verdict(ran: Ran) -> str:
    """What verify's exit code says (README: 0 pass, 1 a gate failed, 2 bad input, 3 missing capability)."""
    meaning = {0: "pass", 1: "gate failed", 2: "bad input", 3: "missing capability"}.get(ran.returncode, "crashed")
    detail = f": {ran.last_line}" if ran.returncode else ""
    return f"exit {ran.returncode} ({meaning}{detail})"[:160]


def bench_verify(s: Settings) -> None:
    """verify's time with references computed, then stored; its verdict as its exit code gives it.

    A random-weight YOLO finds nothing at confidence 0.25, so its task check compares nothing and
    verify exits 1 saying so: the row reports that, not a pass. Depth-Anything's map is compared.
    """
    with tempfile.TemporaryDirectory() as tmp:
        env = {"ENGINEKIT_CACHE": str(Path(tmp) / "c")}
        for model, profile in s.verify:
            if s.verify_onnx:  # the FP16 graph itself, no engine
                target = str(Path(tmp) / f"{model}.fp16.onnx")
                wall([*ENGINEKIT, "export", model, "--random-init", "--input", profile, "--fp16", "-o", target], env)
                verify = [*ENGINEKIT, "verify", target, "--random-init"]
            else:
                wall([*ENGINEKIT, "build", model, "--random-init", "--precision", "fp16", "--profile", profile], env)
                verify = [*ENGINEKIT, "verify", model, "--random-init", "--precision", "fp16", "--profile", profile]
            first, second = run(verify, env), run(verify, env)
            record("verify", f"{model} fp16 verify, references computed", first.seconds, "s", verdict(first))
            record("verify", f"{model} fp16 verify, references stored (no PyTorch forward)", second.seconds, "s",
                   verdict(second))


LOAD_TIMED = """
import sys, time
# the imports load() needs, before the clock starts: Ultralytics' LetterBox (the runtime's preprocessing) imports torch
import enginekit, enginekit.api, numpy, onnxruntime, ultralytics.data.augment
start = time.perf_counter()
model = enginekit.load(sys.argv[1], random_init=True, backend="onnxruntime-cpu", quiet=True)
print(f"{time.perf_counter() - start:.4f}")
"""


def bench_hits(s: Settings) -> None:
    """Cold, then warm (the same command again, nothing changed): what a cache hit costs."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        env = {"ENGINEKIT_CACHE": str(Path(tmp) / "c")}
        model, shape = s.hits_export
        export = [*ENGINEKIT, "export", model, "--random-init", "--input", shape, "-o", str(Path(tmp) / "m.onnx")]
        for label in ("cold", "warm"):
            ran = checked(export, env)
            stored = "stored verdict" in ran.stderr or label == "cold"
            record("hits", f"{model} export {shape}, {label}", ran.seconds, "s",
                   f"{cpu_note([ran.cpu])}{'' if stored else '; NO STORED VERDICT'}")
        for label in ("cold", "warm"):
            done = subprocess.run([sys.executable, "-c", LOAD_TIMED, s.hits_load], env={**os.environ, **env},
                                  capture_output=True, text=True)
            if done.returncode:
                raise BenchError(f"load({s.hits_load!r}) exited {done.returncode}: {done.stderr.strip()[-300:]}")
            record("hits", f"load({s.hits_load!r}, backend='onnxruntime-cpu') after imports, {label}",
                   float(done.stdout.split()[-1]), "s")
        recipes = [f"RECIPE_NAMES={' '.join(s.nightly)}"] if s.nightly else []
        nightly = ["make", "-C", str(root), "--no-print-directory", "nightly", f"REPORTS={Path(tmp) / 'reports'}",
                   *recipes]
        what = ", ".join(s.nightly) if s.nightly else "the shipped recipes"
        for label in ("cold", "warm"):
            ran = run(nightly, env)
            record("hits", f"make nightly ({what}), {label}", ran.seconds, "s",
                   f"{cpu_note([ran.cpu])}; exit {ran.returncode}")


SECTIONS = {"help": bench_help, "cold": bench_cold, "export": bench_export, "ort": bench_ort, "build": bench_build,
            "int8": bench_int8, "verify": bench_verify, "hits": bench_hits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", default=",".join(SECTIONS), help="comma-separated: " + ",".join(SECTIONS))
    parser.add_argument("--quick", action="store_true", help="small inputs, single runs: checks the script works")
    parser.add_argument("--repeats", type=int, help="runs per timed configuration (default 3; --quick 1)")
    parser.add_argument("--models", help="comma-separated: only these of the cold, int8 and verify models")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    settings = dataclasses.replace(QUICK if args.quick else Settings())
    if args.repeats is not None:
        if args.repeats < 1:
            print("error: --repeats must be at least 1", file=sys.stderr)
            return 2
        settings.repeats = args.repeats
    if args.models:
        wanted = {name.strip() for name in args.models.split(",") if name.strip()}
        known = {model for pairs in (settings.cold, settings.int8, settings.verify) for model, _ in pairs}
        if not wanted <= known:
            print(f"error: unknown model {sorted(wanted - known)[0]!r}: choose from {', '.join(sorted(known))}",
                  file=sys.stderr)
            return 2
        for field in ("cold", "int8", "verify"):
            setattr(settings, field, tuple(pair for pair in getattr(settings, field) if pair[0] in wanted))
    names = [name.strip() for name in args.section.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown:
        print(f"error: unknown section {unknown[0]!r}: choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, {load()}"
          f"{' (shared: compare within one run)' if os.getloadavg()[0] > 0.5 else ''}", flush=True)
    status = 0
    try:
        for name in names:
            SECTIONS[name](settings)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        status = 1
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
