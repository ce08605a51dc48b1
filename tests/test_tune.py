"""enginekit tune: the search (a fake measurer whose figures follow the settings), the request, and the
command on a CPU with ONNX Runtime (small inputs), its recipe built by `enginekit build`."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import assert_one_line_error
from enginekit.errors import UsageError
from enginekit.flows.tune import (Budget, Candidate, Measured, Setting, Targets, TuneOutcome, choose, search,
                                  search_all)


def candidate(model="m", backend="tensorrt", precision="fp32", size=320, batch=1, on_gpu=True):
    return Candidate((Setting(model, backend, precision, (size, size), batch, on_gpu),))


def grid(model="m", sizes=(160, 320, 640), precisions=("fp16", "fp32")):
    return [candidate(model, precision=p, size=s) for s in sizes for p in precisions]


class FakeMeasurer:
    """Latency proportional to the input's area (half at fp16), one frame per step; records what it measured."""

    def __init__(self, per_pixel_ms=1e-4, accuracy=lambda s: "pass", seconds=1.0, clock=None):
        self.per_pixel_ms, self.accuracy, self.seconds, self.clock = per_pixel_ms, accuracy, seconds, clock
        self.measured: list[str] = []

    def ms(self, s: Setting) -> float:
        return s.input[0] * s.input[1] * self.per_pixel_ms * (0.5 if s.precision == "fp16" else 1.0)

    def __call__(self, c: Candidate) -> Measured:
        if self.clock is not None:
            self.clock.now += self.seconds
        self.measured.append(c.label())
        verdicts = [self.accuracy(s) for s in c.settings]
        if "fail" in verdicts:
            return Measured(accuracy="fail", accuracy_detail="parity scores rel_l2 = 0.2 > 0.01")
        ms = sum(self.ms(s) for s in c.settings)
        return Measured(ms, ms * 1.1, ms * 1.2, 1000.0 / ms, accuracy=verdicts[0])


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def by_label(cands):
    return {c.label(): c for c in cands}


def test_search_goes_cheapest_first_prunes_what_a_cheaper_setting_misses_and_chooses_the_most_accurate():
    # latencies: 160 fp16 1.3, fp32 2.6; 320 fp16 5.1 fp32 10.2; 640 fp16 20.5 fp32 41 (x1.2 at p99)
    measure = FakeMeasurer()
    done = search(grid(), measure, Targets(p99=8.0), Budget(None))
    got = by_label(done)
    assert measure.measured == [c.label() for c in sorted(grid(), key=lambda c: c.cost())][:5]
    assert [got[f"m tensorrt {p} {s}x{s} batch 1"].verdict for s in (160, 320, 640) for p in ("fp16", "fp32")] == \
        ["meets", "meets", "meets", "misses", "misses", "pruned"]
    pruned = got["m tensorrt fp32 640x640 batch 1"]
    assert "320x320" in pruned.reason and "already misses" in pruned.reason and pruned.measured is None
    assert "p99 12.3 ms > 8" in got["m tensorrt fp32 320x320 batch 1"].reason
    chosen = choose(done)
    assert chosen.label() == "m tensorrt fp16 320x320 batch 1" and chosen.chosen  # the largest input that meets


def test_a_candidate_failing_verify_is_out_prunes_nothing_and_is_never_chosen():
    measure = FakeMeasurer(accuracy=lambda s: "fail" if s.precision == "fp16" else "pass")
    done = search(grid(sizes=(160, 320)), measure, Targets(p50=20.0), Budget(None))
    got = by_label(done)
    assert got["m tensorrt fp16 320x320 batch 1"].verdict == "out"
    assert "rel_l2" in got["m tensorrt fp16 320x320 batch 1"].reason
    assert got["m tensorrt fp32 320x320 batch 1"].verdict == "meets"  # measured although fp16 failed
    assert choose(done).label() == "m tensorrt fp32 320x320 batch 1"


def test_a_candidate_less_accurate_than_one_that_meets_is_left_out():
    # measured most accurate first (as pipelines are): once 320 fp32 meets, every smaller input is left out
    measure = FakeMeasurer()
    done = search(grid(sizes=(160, 320)), measure, Targets(fps=50), Budget(None), order="accuracy")
    assert measure.measured == ["m tensorrt fp32 320x320 batch 1"]
    assert all(c.verdict == "pruned" and "more accurate" in c.reason for c in done[1:])


def test_budget_stops_starting_candidates():
    clock = Clock()
    measure = FakeMeasurer(seconds=10.0, clock=clock)
    done = search(grid(), measure, Targets(p99=1000.0), Budget(0.5, clock=clock), exact_only=True)
    assert len(measure.measured) == 3  # 10 s each: a fourth would end past 30 s
    rest = [c for c in done if c.measured is None]
    assert len(rest) == 3 and all(c.verdict == "not measured" and "budget" in c.reason for c in rest)


def test_several_models_search_pipelines_of_what_met_alone_most_accurate_first():
    measure_one, measure_many = FakeMeasurer(), FakeMeasurer()
    per_model = [grid("a", sizes=(160, 320)), grid("b", sizes=(160, 320), precisions=("fp16",))]
    # alone: a 160 fp16 1.3/1.5, a 160 fp32 2.6/3.1, a 320 fp16 5.1/6.1, a 320 fp32 10.2/12.3; b 1.3/1.5, 5.1/6.1
    considered, chosen = search_all(per_model, measure_one, measure_many, Targets(p99=10.0), Budget(None), 1)
    pipelines = [c for c in considered if c.kind == "pipeline"]
    assert len(pipelines) == 6  # the 3 x 2 settings that met alone (a 320 fp32 missed)
    assert chosen is not None and chosen.kind == "pipeline"
    # most accurate first: a 320 fp16 + b 320 fp16 (12.3 ms at p99) misses; then a 160 fp32 + b 320 fp16 (as many
    # pixels as a 320 + b 160, at a higher precision) meets, and every less accurate pair is left out
    assert measure_many.measured == ["a tensorrt fp16 320x320 batch 1 + b tensorrt fp16 320x320 batch 1",
                                     "a tensorrt fp32 160x160 batch 1 + b tensorrt fp16 320x320 batch 1"]
    assert chosen.label() == measure_many.measured[1]
    assert all(c.verdict in ("pruned", "misses") for c in pipelines if not c.chosen)


def test_nothing_meets_names_the_best_figures_reached():
    measure = FakeMeasurer()
    done = search(grid(sizes=(320, 640)), measure, Targets(p99=1.0, fps=500), Budget(None))
    outcome = TuneOutcome(Targets(p99=1.0, fps=500), done, choose(done), "video", {})
    assert not outcome.met
    line = outcome.best_line()
    assert line.startswith("no candidate meets p99 <= 1 ms, >= 500 frames/s: the best reached p50 5.1 ms")
    assert "m tensorrt fp16 320x320 batch 1" in line and "\n" not in line
    data = outcome.to_json()
    assert data["chosen"] is None and {"p50_ms", "p95_ms", "p99_ms", "fps", "settings", "verdict"} <= set(
        data["candidates"][0])


def test_cost_order_and_pruning_respect_the_device():
    # on a CPU, fp16 is not expected to be cheaper, and a missed fp32 does not rule out fp16
    cpu = [candidate(precision=p, on_gpu=False, backend="onnxruntime-cpu") for p in ("fp16", "fp32")]
    assert sorted(cpu, key=lambda c: c.cost())[0].settings[0].precision == "fp32"
    assert not cpu[1].costs_no_more(cpu[0]) and not cpu[0].costs_no_more(cpu[1])
    gpu = [candidate(precision=p) for p in ("fp16", "fp32")]
    assert gpu[0].costs_no_more(gpu[1]) and not gpu[1].costs_no_more(gpu[0])


def test_a_gpu_machine_times_gpu_backends_unless_others_are_named(monkeypatch):
    from enginekit import backends
    from enginekit.backends.base import Verdict
    from enginekit.flows.tune import searchspace as tune
    from enginekit.flows.tune import default_backends

    for b in backends.auto_order():  # every backend would run: only the machine decides
        monkeypatch.setattr(b, "check", classmethod(lambda cls, *a, **k: Verdict(True, "runs")))
    monkeypatch.setattr(tune, "gpu_info", lambda: object())  # where the search space looks it up
    on_gpu = default_backends(None)
    kinds = {backends.get(n).runs_on for n in on_gpu}
    assert on_gpu and "cpu" not in kinds, on_gpu  # ONNX Runtime CPU is not timed where a GPU is
    assert default_backends("cpu") == [b.name for b in backends.auto_order() if b.runs_on == "cpu"]
    monkeypatch.setattr(tune, "gpu_info", lambda: None)
    assert default_backends(None) == default_backends("cpu")


# -- the request ----------------------------------------------------------------------------------------------
def test_request_reads_targets_and_refuses_what_cannot_run():
    from enginekit.requests import TuneRequest

    r = TuneRequest(models="yolo12n,depth", random_init=True, p99="25ms", p50="10", p95="0.02s", fps=60,
                    inputs=["320,384x640"], batches="1,2", frames_per_step=2, backends="onnxruntime-cpu")
    assert (r.p50, r.p95, r.p99) == (10.0, 20.0, 25.0) and r.inputs == ["320x320", "384x640"]
    assert r.batches == [1, 2] and r.models == ["yolo12n", "depth"]
    r = TuneRequest(models="yolo12n,depth", random_init=True, p99=25, inputs="yolo12n=128,depth=112,depth=98x140")
    assert r.sizes(0) == [(128, 128)] and r.sizes(1) == [(112, 112), (98, 140)]
    with pytest.raises(UsageError, match="multiple of 32.*--input yolo12n=SIZE"):
        TuneRequest(models="yolo12n,depth", random_init=True, p99=25, inputs="112")
    bad = [dict(p99="fast"), dict(p99="-3ms"), dict(), dict(p99=25, batches="4"), dict(p99=25, backends="tensorrtx"),
           dict(p99=25, precisions="fp12"), dict(p99=25, inputs="big"), dict(p99=25, models="yolo12n,yolo12n"),
           dict(p99=25, models="nonet"), dict(p99=25, inputs="100"), dict(p99=25, inputs="seg=320")]
    for options in bad:
        with pytest.raises(UsageError):
            TuneRequest(**{"models": "yolo12n", "random_init": True, **options})


# -- the command on a CPU -------------------------------------------------------------------------------------
def test_tune_on_cpu_chooses_writes_a_recipe_that_builds(run_cli, tmp_path):
    """yolo12n at 160 and 192 on ONNX Runtime: both built, verified (informative random weights) and timed;
    the larger chosen under a generous target; its recipe loads, and `enginekit build` builds it."""
    from enginekit.recipes import load_recipe

    recipe = tmp_path / "tuned" / "yolo.yaml"
    r = run_cli("tune", "yolo12n", "--random-init", "--backend", "onnxruntime-cpu", "--input", "160,192",
                "--p99", "20000ms", "--frames", "4", "--json", "--write-recipe", str(recipe))
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    cands = data["candidates"]
    assert [c["settings"][0]["input"] for c in cands] == ["160x160", "192x192"]  # cheapest first
    assert all(c["verdict"] == "meets" and c["p50_ms"] > 0 and c["fps"] > 0 for c in cands)
    # the informative random yolo12n finds detections at 160 and 192: parity and task gates compared something
    # (as Ultralytics builds it, they compared nothing and read "not checkable")
    assert all(c["accuracy"] == "pass" for c in cands), [c["accuracy_detail"] for c in cands]
    assert data["chosen"]["settings"][0] == {"model": "yolo12n", "backend": "onnxruntime-cpu", "precision": "fp32",
                                             "input": "192x192", "batch": 1}
    loaded = load_recipe(str(recipe))
    assert loaded.runtime.backend == "onnxruntime-cpu" and loaded.profiles == ["1x3x192x192"]
    assert not loaded.verification.task_required and yaml.safe_load(recipe.read_text())["model"]["random_init"]
    built = run_cli("build", str(recipe))
    assert built.code == 0, built.stderr
    assert built.stdout.strip().endswith("engine.plan")


def test_tune_takes_a_declared_model_two_frames_a_step_and_writes_its_declaration(run_cli, tmp_path):
    """The VR shape on the CPU at a small size: a declared segmenter (torchvision's LR-ASPP, 3 classes), two frames
    per step in one batch of 2, the VR targets' three percentiles (p99 generous: a 2-core machine shared with other
    tests); the recipe declares the model as tune took it, and loads."""
    from enginekit.recipes import load_recipe

    recipe = tmp_path / "seg.yaml"
    r = run_cli("tune", "torchvision:lraspp_mobilenet_v3_large", "--random-init", "--classes", "3", "--size", "64x64",
                "--backend", "onnxruntime-cpu", "--input", "64", "--frames-per-step", "2", "--p50", "60000",
                "--p95", "60000", "--p99", "60000ms", "--frames", "4", "--json", "--write-recipe", str(recipe))
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    (cand,) = data["candidates"]
    assert cand["settings"][0]["batch"] == 2 and cand["settings"][0]["input"] == "64x64" and cand["verdict"] == "meets"
    loaded = load_recipe(str(recipe))
    assert loaded.model.declared() == {"size": "64x64", "classes": 3}
    assert loaded.runtime.frames_per_step == 2 and loaded.runtime.batch == 2
    two = run_cli("tune", "torchvision:lraspp_mobilenet_v3_large,yolo12n", "--random-init", "--classes", "3", "--p99", "25")
    assert_one_line_error(two, 2, "--classes declare one model")


def test_tune_with_an_impossible_target_exits_1_in_one_line(run_cli, tmp_path):
    r = run_cli("tune", "yolo12n", "--random-init", "--backend", "onnxruntime-cpu", "--input", "160",
                "--p99", "0.01ms", "--frames", "4", "--write-recipe", str(tmp_path / "r.yaml"))
    line = assert_one_line_error(r, 1, "no candidate meets p99 <= 0.01 ms", "the best reached p50",
                                 "yolo12n onnxruntime-cpu fp32 160x160")
    assert "frames/s" in line and not (tmp_path / "r.yaml").exists()


@pytest.mark.parametrize("args, needle", [
    (["--p99", "soon"], "--p99"),
    ([], "no target"),
    (["--p99", "25", "--batch", "2"], "--batch 2"),
    (["--p99", "25", "--every", "depth=2"], "--every depth=2"),
    (["--p99", "25", "--backend", "tensorrt-x"], "unknown backend"),
])
def test_tune_bad_usage_is_one_line_exit_2(run_cli, args, needle):
    r = run_cli("tune", "yolo12n", "--random-init", *args)
    assert_one_line_error(r, 2, needle)


@pytest.mark.slow
def test_tune_two_models_writes_one_recipe_each(run_cli, tmp_path):
    """yolo12n (at the size the test above built) and yolov8n, yolov8n every second step: each alone, then
    their pipeline; a folder with one recipe per model, each with its cadence. (Depth-Anything's export costs
    a minute on two cores; the pairing does not depend on the family.)"""
    from enginekit.recipes import load_recipe

    out = tmp_path / "tuned"
    r = run_cli("tune", "yolo12n,yolov8n", "--random-init", "--backend", "onnxruntime-cpu",
                "--input", "yolo12n=160,yolov8n=128", "--p99", "60000ms", "--frames", "5", "--every", "yolov8n=2",
                "--json", "--write-recipe", str(out))
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    assert [c["kind"] for c in data["candidates"]] == ["model", "model", "pipeline"]
    assert data["chosen"]["kind"] == "pipeline" and data["chosen"]["fps"] > 0
    pipeline = data["chosen"]["stream"]["in_flight_1"]
    assert pipeline["models"]["yolov8n"]["runs"] * 2 == pipeline["models"]["yolo12n"]["runs"]
    assert [s["input"] for s in data["chosen"]["settings"]] == ["160x160", "128x128"]
    recipes = {p.name: load_recipe(str(p)) for p in out.glob("*.yaml")}
    assert set(recipes) == {"yolo12n.yaml", "yolov8n.yaml"}
    assert recipes["yolov8n.yaml"].runtime.every == 2 and recipes["yolov8n.yaml"].profiles == ["1x3x128x128"]
    assert recipes["yolo12n.yaml"].runtime.every == 1


def test_verify_checks_tune_candidates_on_frames_of_the_users_source(tmp_path):
    """With --source, each candidate's gates run on frames of it (what the model will see: a segmenter trained on
    its own scenes finds nothing on the embedded photographs, and its task gate there compares nothing)."""
    import cv2

    from enginekit.flows.tune.flow import CHECK_FRAMES, _check_frames
    from enginekit.images import write_video

    video = write_video(tmp_path / "v.mp4", 30, (96, 128))
    folder = _check_frames(str(video), tmp_path / "check")
    frames = sorted(folder.glob("*.png"))
    assert len(frames) == CHECK_FRAMES
    images = [cv2.imread(str(f)) for f in frames]
    assert all(i.shape == (96, 128, 3) for i in images)
    assert len({i.tobytes() for i in images}) == CHECK_FRAMES  # frames spread over the video, not one repeated
    assert _check_frames(None, tmp_path / "none") is None and _check_frames("0", tmp_path / "cam") is None
