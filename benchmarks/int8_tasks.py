"""INT8 of the suite's trained segment, pose, obb, classify, semantic and depth models: which calibration set and method
keep what FP32 predicts (the figures written in families/ultralytics/yolo.py).

Each cell quantizes the simplified graph (the build's chain, the family's head exclusions) and
compares it on ONNX Runtime, CPU, with the FP32 PyTorch model on held-out generated images, through
the gates verify uses (per part parity, the task's metrics at ``--conf``). Calibration sets:
``photos`` (the 8 embedded photographs, the default), ``shapesN`` (N generated images of the model's
own kind, another seed than the evaluation's), ``noise``. Methods: ``max``, ``entropy``, and
``pctP`` (ONNX Runtime's percentile calibrator at P, through the stage's calibrator hook; not an
enginekit option).

    PYTHONPATH=src:tests python benchmarks/int8_tasks.py --tasks segment,pose,obb --conf 0.25,0.1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]


def _percentile(method: str):
    """A context in which the stage's calibrator is ONNX Runtime's percentile one."""
    import contextlib

    import enginekit.stages.int8 as int8
    from onnxruntime.quantization.calibrate import CalibrationMethod

    @contextlib.contextmanager
    def swapped():
        original = int8._Calibrating.calibrator

        def calibrator(self, make_real, *args, **kwargs):
            kwargs["calibrate_method"] = CalibrationMethod.Percentile
            kwargs["extra_options"] = {**(kwargs.get("extra_options") or {}), "percentile": float(method[3:]),
                                       "symmetric": True}
            return original(self, make_real, *args, **kwargs)

        int8._Calibrating.calibrator = calibrator
        try:
            yield
        finally:
            int8._Calibrating.calibrator = original

    return swapped()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", default="segment,pose,obb,classify")
    parser.add_argument("--sets", default="photos,shapes8,noise")
    parser.add_argument("--methods", default="max,entropy")
    parser.add_argument("--conf", default="0.25,0.1")
    parser.add_argument("--margins", default="0")
    args = parser.parse_args()

    from trained_tasks import MODELS, held_out_images, trained_task_model

    from enginekit.cache import Cache
    from enginekit.calibration import CalibrationData
    from enginekit.compare.comparison import Case, Gates, compare
    from enginekit.images import load_images
    from enginekit.onnx import runtime
    from enginekit.pipeline import ModelRequest, Stages

    work = Path(tempfile.mkdtemp(prefix="int8-tasks-"))
    for task in args.tasks.split(","):
        hw = {"classify": (96, 96), "semantic": (128, 128), "depth": (128, 128)}.get(task, (160, 160))
        shape = (1, 3, *hw)
        evaluation = load_images(held_out_images(work / f"held-out-{task}", task, count=8)).images
        for method in args.methods.split(","):
            # a cache per method: the percentile graphs are keyed as max ones
            pipe = Stages(ModelRequest(MODELS[task], trained_task_model(task)), Cache(work / f"cache-{method}"))
            adapter, loaded = pipe.adapter, pipe.loaded
            source = pipe.simplify(pipe.export(shape, 18), shape)
            cases = []
            for i, image in enumerate(evaluation):
                feed = {adapter.input_name: adapter.preprocess(image, hw)}
                cases.append(Case(f"photo {i}", "photo", feed, adapter.reference(loaded, feed[adapter.input_name])))
            for name in args.sets.split(","):
                if name == "photos":
                    data = CalibrationData(None, count=8)
                elif name == "noise":
                    np.save(work / "noise.npy", np.random.default_rng(0).random((8, *shape[1:]), dtype=np.float32))
                    data = CalibrationData(work / "noise.npy", count=8)
                else:
                    n = int(name[len("shapes"):])
                    data = CalibrationData(held_out_images(work / f"calib-{task}-{n}", task, count=n, seed=20_000),
                                           count=n)
                start = time.perf_counter()
                if method.startswith("pct"):
                    with _percentile(method):
                        graph = pipe.int8(source, shape, data, method="max")
                else:
                    graph = pipe.int8(source, shape, data, method=method)
                seconds = time.perf_counter() - start
                session = runtime.session(graph.path)
                points = [(c, m) for c in map(float, args.conf.split(",")) for m in map(float, args.margins.split(","))]
                for conf, margin in points if "conf" in adapter.task_options else [(None, None)]:
                    options = {"conf": conf, "conf_margin": margin} if conf is not None else {}
                    result = compare(lambda feed: runtime.run(session, feed), cases, adapter=adapter,
                                     gates=Gates(adapter, options), precision="int8", metadata=loaded.metadata)
                    figures = {k: round(v, 3) for k, v in result.task.items()
                               if k in ("compared", "recall", "precision", "threshold_flips", "map50", "mask_map50",
                                        "pose_map50", "top1_agreement", "reference_classes", "miou",
                                        "pixel_accuracy", "relative_spread", "abs_rel", "delta1")}
                    parity = {p: round(w["rel_l2"], 4) for p, w in result.worst.items()}
                    failed = [c.name for c in result.checks if not c.passed]
                    print(f"{task:8} {method:9} {name:8} conf {conf} margin {margin} calib {seconds:5.1f} s  "
                          f"{'pass' if result.passed else 'FAIL'} {failed}\n    task {figures}\n    rel L2 {parity}",
                          flush=True)


if __name__ == "__main__":
    main()
