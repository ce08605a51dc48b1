"""INT8 of trained detectors nobody tuned enginekit for: what keeps their detections, measured.

For each model (the composites detectors and segmenter that benchmarks/train_composites.py trains on
photographs composed by benchmarks/composites.py, and the suite's own trained yolov8n and yolo11n-seg on
coloured shapes), the simplified FP32 graph of the build's chain is quantized under one *configuration*
(calibration method, images, which nodes stay out of INT8, ModelOpt options) and compared on ONNX
Runtime (CPU) with the FP32 PyTorch model on held-out images of the model's own kind (val images it was
not trained on; generated shapes of another seed for the suite's models):

- nodes kept in high precision: of the nodes ModelOpt quantizes when nothing is excluded (Conv, and the
  Add/Concat/MaxPool/Resize... it gives Q/DQ inputs), those that are not quantized in the graph;
- parity per output part (rel L2, cosine, max abs) on the held-out images, and on one random-noise input;
- the task metrics verify gates at conf 0.25 (recall, precision, mAP50 against the FP32 detections),
  plus recall/precision with a conf margin (a detection whose score crosses 0.25 by less than it is a
  threshold flip, not a loss).

``--repair`` searches, per model, the fewest nodes to keep in high precision for the gates (the
configuration's graph, Q/DQ removed around the chosen nodes) with each ranking (``--rankings``), on the
first ``--search`` held-out images, and reports the final graph on all of them.

    PYTHONPATH=src:tests python benchmarks/int8_detectors.py --models v8s --configs family-max,head-max \
        --models-dir MODELS --eval 24 --calib 64 --out /tmp/int8det/results.jsonl

``--models-dir`` (needed for the composites models v8s, y11s-wide, y11n-seg): the folder
benchmarks/train_composites.py wrote (``<name>.pt``) with their datasets under ``data/<name>/images/{train,val}``.
The suite's models (suite-v8n, suite-seg) need none.

Figures in benchmarks/int8_detectors.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

SHAPE = (1, 3, 640, 640)
OPSET = 18

# The last convolution of each head branch (box/DFL cv2, class cv3, mask coefficients / keypoints cv4),
# the DFL and the mask prototypes' last convolution: what NVIDIA's YOLO PTQ guides keep in FP16.
HEAD_OUTPUTS = (r"/model\.\d+/(one2one_)?cv[234]\.\d+/(one2one_)?cv[234]\.\d+\.2/",
                r"/model\.\d+/(one2one_)?dfl/", r"/model\.\d+/proto/cv3/")
# Only the convolutions writing the class scores, and the DFL.
SCORE_OUTPUTS = (r"/model\.\d+/(one2one_)?cv3\.\d+/(one2one_)?cv3\.\d+\.2/", r"/model\.\d+/(one2one_)?dfl/")


@dataclass
class Config:
    name: str
    method: str = "max"  # max | entropy | pctNN.NNN
    exclude: str = "family"  # family | head | scores | none
    op_types: tuple[str, ...] | None = None  # ModelOpt op_types_to_quantize (None: its default placement)
    passes: tuple[str, ...] = ("concat_elimination",)
    calib: str = "own"  # own | photos (the 8 embedded photographs)
    calib_count: int | None = None  # None: --calib


CONFIGS = {c.name: c for c in (
    Config("family-max"),  # enginekit's default before this study
    Config("family-entropy", method="entropy"),
    Config("none-max", exclude="none"),
    Config("head-max", exclude="head"),
    Config("scores-max", exclude="scores"),
    Config("head-entropy", method="entropy", exclude="head"),
    Config("head-pct99.99", method="pct99.99", exclude="head"),
    Config("head-pct99.999", method="pct99.999", exclude="head"),
    Config("head-max-conv", exclude="head", op_types=("Conv",)),
    Config("head-max-noconcat", exclude="head", passes=()),
    Config("head-max-photos", exclude="head", calib="photos"),
    Config("head-max-16", exclude="head", calib_count=16),
    Config("head-max-8", exclude="head", calib_count=8),
    Config("head-entropy-16", method="entropy", exclude="head", calib_count=16),
    Config("head-pct99.99-16", method="pct99.99", exclude="head", calib_count=16),
    Config("head-pct99.999-16", method="pct99.999", exclude="head", calib_count=16),
    Config("head-pct99.999-8", method="pct99.999", exclude="head", calib_count=8),
    Config("head-pct99.999-photos", method="pct99.999", exclude="head", calib="photos"),
    Config("family-max-photos", calib="photos"),
)}


@dataclass
class ModelSpec:
    name: str
    variant: str
    weights: Path
    calib_images: list[Path]
    eval_images: list[Path]
    imgsz: int = 640


def _sorted_images(folder: Path) -> list[Path]:
    from enginekit.images import list_images

    return list_images(folder)


def model_specs(names: list[str], models_dir: Path | None, work: Path, calib: int, n_eval: int) -> list[ModelSpec]:
    specs = []
    composites = {"v8s": ("yolov8s", "v8s-composites"), "y11s-wide": ("yolo11s", "y11s-composites-wide"),
                  "y11n-seg": ("yolo11n-seg", "y11n-seg-composites")}
    for name in names:
        if name in composites and models_dir is None:
            raise SystemExit(f"error: {name} needs --models-dir (the folder benchmarks/train_composites.py wrote)")
        if name in composites:
            variant, stem = composites[name]
            data = models_dir / "data" / stem / "images"
            specs.append(ModelSpec(name, variant, models_dir / f"{stem}.pt", _sorted_images(data / "train")[:calib],
                                   _sorted_images(data / "val")[:n_eval]))
        elif name == "suite-v8n":
            from trained_detector import trained_detector, write_held_out_images

            det = trained_detector()
            cal = write_held_out_images(work / "suite-v8n-calib", count=calib, size=640, seed=20_000)
            ev = write_held_out_images(work / "suite-v8n-eval", count=n_eval, size=640)
            specs.append(ModelSpec(name, det.model, det.weights, _sorted_images(cal), _sorted_images(ev)))
        elif name == "suite-seg":
            from trained_tasks import held_out_images, trained_task_model

            cal = held_out_images(work / "suite-seg-calib", "segment", count=calib, seed=20_000)
            ev = held_out_images(work / "suite-seg-eval", "segment", count=n_eval)
            specs.append(ModelSpec(name, "yolo11n-seg", trained_task_model("segment"), _sorted_images(cal),
                                   _sorted_images(ev), imgsz=160))
        else:
            raise SystemExit(f"unknown model {name}")
    return specs


# -- quantization with ModelOpt's options ------------------------------------------------------------


def exclude_patterns(adapter, kind: str) -> list[str]:
    return {"family": list(adapter.int8_exclude), "head": list(HEAD_OUTPUTS), "scores": list(SCORE_OUTPUTS),
            "none": []}[kind]


def quantize(src: Path, out: Path, calib: np.ndarray, input_name: str, config: Config, exclude: list[str]) -> float:
    """ModelOpt's INT8 pass with the configuration's options; returns seconds. Percentile: ONNX Runtime's
    percentile calibrator through the stage's calibrator hook (ModelOpt's INT8 API offers max and entropy)."""
    from modelopt.onnx.quantization import quantize as mo_quantize
    from modelopt.onnx.quantization.calib_utils import CalibrationDataProvider
    from onnxruntime.quantization.calibrate import CalibrationMethod

    from enginekit.stages.fp16 import quiet_modelopt
    from enginekit.stages.modelopt import calibration_eps, calibrator_factory

    quiet_modelopt()

    def make(make_real, *args, **kwargs):
        if config.method.startswith("pct"):
            kwargs["calibrate_method"] = CalibrationMethod.Percentile
            kwargs["extra_options"] = {**(kwargs.get("extra_options") or {}), "percentile": float(config.method[3:]),
                                       "symmetric": True}
        return make_real(*args, **kwargs)

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="int8det-") as tmp:
        work = Path(tmp) / "model.onnx"
        shutil.copyfile(src, work)
        reader = CalibrationDataProvider(str(work), {input_name: calib})
        with calibrator_factory(make), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            mo_quantize(str(work), quantize_mode="int8", calibration_method="entropy" if config.method == "entropy"
                        else "max", calibration_data_reader=reader, calibration_eps=calibration_eps(),
                        nodes_to_exclude=exclude or None, op_types_to_quantize=list(config.op_types or []) or None,
                        passes=list(config.passes), high_precision_dtype="fp32", output_path=str(out),
                        log_level="ERROR")
    import onnx

    model = onnx.load(str(out))
    del model.graph.value_info[:]
    onnx.save(model, str(out))
    return time.perf_counter() - start


# -- evaluation ----------------------------------------------------------------------------------------


@dataclass
class Bench:
    spec: ModelSpec
    pipe: object
    source: object  # the simplified FP32 artifact
    photo_cases: list
    noise_cases: list
    calib_batches: dict = field(default_factory=dict)
    universe: list[str] = field(default_factory=list)
    universe_conv: set[str] = field(default_factory=set)


def prepare(spec: ModelSpec, cache) -> Bench:
    from enginekit.compare.comparison import Case
    from enginekit.images import read_rgb
    from enginekit.model import ModelRequest
    from enginekit.pipeline import Stages

    shape = (1, 3, spec.imgsz, spec.imgsz)
    pipe = Stages(ModelRequest(spec.variant, spec.weights), cache)
    source = pipe.simplify(pipe.export(shape, OPSET), shape)
    adapter, loaded = pipe.adapter, pipe.loaded
    cases = []
    for p in spec.eval_images:
        feed = {adapter.input_name: adapter.preprocess(read_rgb(p), shape[2:])}
        cases.append(Case(f"photo {p.name}", "photo", feed, adapter.reference(loaded, feed[adapter.input_name])))
    noise = adapter.random_inputs(shape, 0)
    noise_cases = [Case("random", "random", {adapter.input_name: noise}, adapter.reference(loaded, noise))]
    return Bench(spec, pipe, source, cases, noise_cases)


def calibration_batch(bench: Bench, config: Config, count: int) -> np.ndarray:
    from enginekit.calibration import CalibrationData

    key = (config.calib, config.calib_count or count)
    if key not in bench.calib_batches:
        adapter, shape = bench.pipe.adapter, (1, 3, bench.spec.imgsz, bench.spec.imgsz)
        if config.calib == "photos":
            data = CalibrationData(None, count=8)
            bench.calib_batches[key] = data.batch(adapter, shape)
        else:
            from enginekit.images import read_rgb

            paths = bench.spec.calib_images[: key[1]]
            bench.calib_batches[key] = np.concatenate([adapter.preprocess(read_rgb(p), shape[2:]) for p in paths])
    return bench.calib_batches[key]


def quantized_sets(path: Path) -> tuple[list[str], set[str]]:
    import onnx

    from enginekit.compare.repair import quantized_nodes

    names = quantized_nodes(path)
    ops = {n.name: n.op_type for n in onnx.load(str(path)).graph.node}
    return names, {n for n in names if ops.get(n) == "Conv"}


def margin_figures(adapter, metadata, ref, got, margin: float) -> dict:
    """Recall/precision with a conf margin (the task option ``conf_margin``, detectors and segmenters alike)."""
    r = adapter.task_metrics(ref, got, metadata, {"conf": 0.25, "conf_margin": margin})
    return {"recall": r["recall"], "precision": r["precision"], "flips": r.get("threshold_flips", 0.0)}


def evaluate(bench: Bench, path: Path, cases=None, margins=(0.0, 0.02, 0.05), tolerances=()) -> dict:
    from enginekit.compare.comparison import Gates, compare
    from enginekit.onnx import runtime

    adapter, metadata = bench.pipe.adapter, bench.pipe.loaded.metadata
    sess = runtime.session(path)

    def run(feed):
        return runtime.run(sess, feed)

    gates = Gates(adapter, list(tolerances))
    cases = cases if cases is not None else bench.photo_cases
    photo = compare(run, cases, adapter=adapter, gates=gates, precision="int8", metadata=metadata)
    noise = compare(run, bench.noise_cases, adapter=adapter, gates=gates, precision="int8", metadata=metadata,
                    require_task=False)
    task = {k: round(float(v), 4) for k, v in photo.task.items()
            if k in ("compared", "recall", "precision", "map50", "map50_95", "mask_map50", "score_shift_max",
                     "candidate_detections")}
    ref = {k: np.concatenate([c.outputs[k] for c in cases]) for k in cases[0].outputs}
    got = {k: [] for k in ref}
    for c in cases:  # the outputs once more for the margin figures (cheap next to quantization)
        out = run(c.feed)
        for k in got:
            got[k].append(out[k])
    got = {k: np.concatenate(v) for k, v in got.items()}
    with_margin = {f"m{m:g}": margin_figures(adapter, metadata, ref, got, m) for m in margins if m}
    parity = {p: {s: round(w[s], 4) for s in ("rel_l2", "cosine", "max_abs")} for p, w in photo.worst.items()}
    noise_worst = noise.structure or noise.worst  # a calibrated graph's noise figures are reported, not gated
    noise_parity = {p: {s: round(w[s], 4) for s in ("rel_l2", "cosine")} for p, w in noise_worst.items()}
    failed = [f"{c.name} {c.value:.3g}" for c in photo.checks if not c.passed]
    noise_failed = [f"{c.name} {c.value:.3g}" for c in noise.checks if not c.passed]
    return {"passed_photos": photo.passed, "failed": failed, "noise_failed": noise_failed, "task": task,
            "margin": with_margin, "parity": parity, "noise_parity": noise_parity}


def graph_for(bench: Bench, config: Config, work: Path, calib_count: int) -> tuple[Path, int, float | None]:
    """(the configuration's INT8 graph, calibration images, seconds; None: made by an earlier run)."""
    adapter = bench.pipe.adapter
    out = work / f"{bench.spec.name}-{config.name}-c{config.calib_count or calib_count}.onnx"
    calib = calibration_batch(bench, config, calib_count)
    seconds = None
    if not out.exists():
        seconds = quantize(bench.source.path, out, calib, adapter.input_name, config,
                           exclude_patterns(adapter, config.exclude))
    return out, len(calib), seconds


def run_config(bench: Bench, config: Config, work: Path, calib_count: int) -> tuple[dict, Path]:
    out, n_calib, seconds = graph_for(bench, config, work, calib_count)
    quantized, q_conv = quantized_sets(out)
    kept = [n for n in bench.universe if n not in set(quantized)]
    row = {"model": bench.spec.name, "config": config.name, "method": config.method, "exclude": config.exclude,
           "calib": f"{config.calib}x{n_calib}", "calib_seconds": round(seconds, 1) if seconds else None,
           "nodes": len(bench.universe), "kept": len(kept), "kept_share": round(len(kept) / len(bench.universe), 3),
           "convs": len(bench.universe_conv), "convs_kept": len(bench.universe_conv - q_conv),
           "eval_images": len(bench.photo_cases), **evaluate(bench, out)}
    return row, out


# -- repair ---------------------------------------------------------------------------------------------


def task_ranking(bench: Bench, quantized_path: Path, names: list[str], cases) -> dict[str, float]:
    """Per candidate: how much of the task loss restoring it alone to FP32 removes (the INT8 graph with
    the Q/DQ around that one node stripped), on ``cases``. Task loss: the squared error of the scores
    (and boxes, in input pixels / 640) of the reference's detections at conf 0.25 and of the candidate's,
    at their anchors: what moves detections across the operating point."""
    import onnx

    from enginekit.compare import repair as rp
    from enginekit.onnx import runtime

    quantized, original = onnx.load(str(quantized_path)), onnx.load(str(bench.source.path))
    loss0 = _task_loss(bench, runtime.session_from_model(quantized), cases)
    gains = {}
    for name in names:
        sess = runtime.session_from_model(rp.strip_qdq(quantized, original, [name]))
        gains[name] = loss0 - _task_loss(bench, sess, cases)
    return gains


def metric_ranking(bench: Bench, quantized_path: Path, names: list[str], cases, tolerances=()) -> dict[str, float]:
    """Per candidate: how much restoring it alone raises the gated task metrics (their shortfall from 1
    summed, mAP50-95 added: a share that moves with every box and score), on ``cases``."""
    import onnx

    from enginekit.compare import repair as rp
    from enginekit.compare.comparison import Gates, compare
    from enginekit.onnx import runtime

    adapter, metadata = bench.pipe.adapter, bench.pipe.loaded.metadata
    gates = Gates(adapter, list(tolerances))
    quantized, original = onnx.load(str(quantized_path)), onnx.load(str(bench.source.path))

    def loss(model) -> float:
        sess = runtime.session_from_model(model)
        found = compare(lambda feed: runtime.run(sess, feed), cases, adapter=adapter, gates=gates, precision="int8",
                        metadata=metadata)
        keys = set(found.task_gates) | {k for k in found.task if k.endswith("map50_95")}
        return sum(1.0 - found.task[k] if found.task_gates.get(k, (">=",))[0] == ">=" else found.task[k]
                   for k in keys if k in found.task)

    base = loss(quantized)
    return {name: base - loss(rp.strip_qdq(quantized, original, [name])) for name in names}


def _task_loss(bench, sess, cases) -> float:
    from enginekit.onnx import runtime

    adapter = bench.pipe.adapter
    nc = len(eval(bench.pipe.loaded.metadata["names"]))  # noqa: S307 - our own metadata
    total = 0.0
    for c in cases:
        ref, got = c.outputs["output0"][0], runtime.run(sess, c.feed)["output0"][0]
        scores_ref, scores_got = ref[4:4 + nc], got[4:4 + nc]
        # anchors where either side scores near or above the operating point
        hot = (scores_ref.max(0) >= 0.1) | (scores_got.max(0) >= 0.1)
        if not hot.any():
            continue
        total += float(((scores_got[:, hot] - scores_ref[:, hot]) ** 2).sum())
        total += float((((got[:4, hot] - ref[:4, hot]) / adapter.default_input[-1]) ** 2).sum())
    return total


def repair(bench: Bench, config: Config, quantized_path: Path, ranking_kind: str, n_search: int,
           max_trials: int, work: Path, tolerances=()) -> dict:
    import onnx

    from enginekit.compare import repair as rp
    from enginekit.compare.comparison import Gates, compare
    from enginekit.onnx import runtime

    adapter, metadata = bench.pipe.adapter, bench.pipe.loaded.metadata
    search_cases = bench.photo_cases[:n_search]
    names = rp.quantized_nodes(quantized_path)
    start = time.perf_counter()
    if ranking_kind == "added-error":  # enginekit's ranking before this study: error each node adds, one photo
        ranking = rp.per_node_error(bench.source.path, quantized_path, search_cases[0].feed, names)
    elif ranking_kind == "added-error-all":
        ranking = {}
        for c in search_cases[:8]:
            for k, v in (rp.per_node_error(bench.source.path, quantized_path, c.feed, names) or {}).items():
                ranking[k] = ranking.get(k, 0.0) + v
    elif ranking_kind == "task":
        ranking = task_ranking(bench, quantized_path, names, search_cases)
    elif ranking_kind == "task-metrics":
        ranking = metric_ranking(bench, quantized_path, names, search_cases, tolerances)
    else:
        ranking = None
    rank_seconds = time.perf_counter() - start
    quantized, original = onnx.load(str(quantized_path)), onnx.load(str(bench.source.path))
    gates = Gates(adapter, list(tolerances))
    path = work / f"{bench.spec.name}-{config.name}-trial.onnx"

    def trial(nodes):
        onnx.save(rp.strip_qdq(quantized, original, nodes), str(path))
        sess = runtime.session(path)
        found = compare(lambda feed: runtime.run(sess, feed), search_cases, adapter=adapter, gates=gates,
                        precision="int8", metadata=metadata)
        return None, found.passed, found.worst_rel_l2

    start = time.perf_counter()
    try:
        result = rp.search(trial, names, ranking, max_trials=max_trials)
        nodes, trials = result.nodes, result.trials
    except Exception as exc:  # noqa: BLE001 - a failed search is a figure too
        return {"model": bench.spec.name, "config": config.name, "ranking": ranking_kind, "error": str(exc)[:200],
                "tolerances": list(tolerances)}
    search_seconds = time.perf_counter() - start
    final = work / f"{bench.spec.name}-{config.name}-{ranking_kind}-repaired.onnx"
    onnx.save(rp.strip_qdq(quantized, original, nodes), str(final))
    quantized_now, q_conv = quantized_sets(final)
    kept = [n for n in bench.universe if n not in set(quantized_now)]
    return {"model": bench.spec.name, "config": config.name, "ranking": ranking_kind, "repaired": nodes,
            "trials": trials, "rank_seconds": round(rank_seconds, 1), "search_seconds": round(search_seconds, 1),
            "nodes": len(bench.universe), "kept": len(kept), "kept_share": round(len(kept) / len(bench.universe), 3),
            "convs": len(bench.universe_conv), "convs_kept": len(bench.universe_conv - q_conv),
            "search_images": len(search_cases), "eval_images": len(bench.photo_cases), "tolerances": list(tolerances),
            **evaluate(bench, final, tolerances=tolerances)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="v8s")
    parser.add_argument("--configs", default="family-max,head-max")
    parser.add_argument("--models-dir", type=Path, default=None,
                        help="the composites models' folder: <name>.pt and data/<name>/images/{train,val}")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "int8-detectors")
    parser.add_argument("--calib", type=int, default=64)
    parser.add_argument("--eval", type=int, default=24)
    parser.add_argument("--repair", default="", help="configurations to repair")
    parser.add_argument("--rankings", default="added-error,task")
    parser.add_argument("--search", type=int, default=12, help="held-out images the repair search runs on")
    parser.add_argument("--max-trials", type=int, default=40)
    parser.add_argument("--tol", action="append", default=[], help="gates of the repair search (--tol as verify's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from enginekit.cache import Cache

    args.work.mkdir(parents=True, exist_ok=True)
    cache = Cache(args.work / "cache")
    out = open(args.out, "a") if args.out else None  # noqa: SIM115

    def emit(row: dict) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    for spec in model_specs(args.models.split(","), args.models_dir, args.work, args.calib, args.eval):
        bench = prepare(spec, cache)
        universe_path = graph_for(bench, CONFIGS["none-max"], args.work, args.calib)[0]
        bench.universe, bench.universe_conv = quantized_sets(universe_path)
        graphs = {}
        for name in args.configs.split(","):
            row, path = run_config(bench, CONFIGS[name], args.work, args.calib)
            graphs[name] = path
            emit(row)
        for name in [c for c in args.repair.split(",") if c]:
            path = graphs.get(name) or graph_for(bench, CONFIGS[name], args.work, args.calib)[0]
            for kind in args.rankings.split(","):
                emit(repair(bench, CONFIGS[name], path, kind, args.search, args.max_trials, args.work, args.tol))


if __name__ == "__main__":
    main()
