"""Recipes: validation with file:line:key errors, flags over the file, CI matrix, make targets."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import assert_one_line_error

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "recipes").glob("*.yaml"))
WORKFLOWS = [REPO / "examples" / "ci" / "nightly.yml", REPO / "examples" / "ci" / "pr-verify.yml"]

TINY_RECIPE = """\
# a small engine: yolo12n at 256x256, FP32, random weights
model:
  variant: yolo12n
  random_init: true
profiles: [1x3x256x256]
precisions: [fp32]
trt: tensorrt-rtx
targets: ["8.6"]
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


# --- shipped recipes -------------------------------------------------------------------


def test_every_recipe_the_issue_names_is_shipped():
    names = {p.stem for p in SHIPPED}
    assert {"yolo12n", "yolo11n", "depth-anything-v2-small", "depth-anything-v2-base"} <= names
    assert {"yolo11n-seg", "yolo11n-pose"} <= names  # a segmenter and a pose model in the nightly too


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_recipe_validates_and_round_trips(path, tmp_path):
    from enginekit.recipes import load_recipe

    recipe = load_recipe(path)
    assert recipe.model.random_init, "CI reaches no model hub: shipped recipes use random weights"
    assert recipe.trt == "tensorrt-rtx" and recipe.cells()
    if recipe.adapter().framework == "ultralytics":  # detectors, segmenters, pose models
        assert recipe.profiles == ["1x3x640x640:8x3x640x640:16x3x640x640"]
        assert "fp16" in recipe.precisions
        # a random-weight detector's INT8 fails its own gates on the embedded photographs: not shipped as a cell
        # the nightly refuses every night (the recipe says how to add it with real weights and images)
        if recipe.adapter().task == "detect":
            assert "int8" not in recipe.precisions and "int8" in path.read_text()
    else:
        sides = {int(s.split("x")[-1]) for p in recipe.profiles for s in p.split(":")}
        assert sides == {392, 518} and "fp16" in recipe.precisions
    # `recipes show` output is itself a valid recipe, equal once resolved
    copy = write(tmp_path, path.name, yaml.safe_dump(recipe.resolved(), sort_keys=False))
    assert load_recipe(copy).resolved() == recipe.resolved()


# --- validation errors: one line naming file, line and key ------------------------------

BAD = {
    "typo": ("model:\n  variant: yolo12n\nprofiles: [1x3x640x640]\nprecisons: [fp16]\n",
             ["typo.yaml:4:", "unknown key 'precisons'", "precisions?"]),
    "nested-typo": ("model:\n  varient: yolo12n\n", ["nested-typo.yaml:2:", "'model.varient'", "model.variant?"]),
    "depth-channels": ("model:\n  variant: depth-anything-v2-small\nprofiles:\n  - 1x3x518x518\n  - 1x4x384x384\n",
                       ["depth-channels.yaml:5:", "profiles[1]", "4 channels"]),
    "unknown-model": ("description: x\nmodel:\n  variant: yolo99q\n", ["unknown-model.yaml:3:", "model.variant",
                                                                        "unknown model 'yolo99q'"]),
    "bad-target": ("model: {variant: yolo12n}\ntrt: tensorrt-rtx\ntargets: ['8.6', '9.0']\n",
                   ["bad-target.yaml:3:", "targets[1]", "9.0"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_recipe_is_one_line_naming_file_line_and_key(run_cli, tmp_path, case):
    text, needles = BAD[case]
    write(tmp_path, f"{case}.yaml", text)
    assert_one_line_error(run_cli("recipes", "show", f"{case}.yaml"), 2, *needles)


@pytest.mark.parametrize("text, needles", [
    # YOLO detectors take any H x W (each profile its own); RT-DETR exports at one
    ("model: {variant: rtdetr-l}\nprofiles: [1x3x640x640, 1x3x320x320]\n", [":2:", "profiles", "one H x W"]),
    ("model: {variant: yolo12n}\nprecisions: [fp16, fp4]\n", [":2:", "precisions[1]", "'fp4'"]),
    ("model: {variant: yolo12n}\nprecisions: [fp16, fp8]\ntrt: tensorrt-rtx\ntargets: ['8.6,8.9']\n",
     [":4:", "targets[0]", "fp8", "8.6"]),
    ("model: {variant: yolo12n}\nverification:\n  tolerances:\n    fp16: {rel_l2: -1}\n",
     [":4:", "verification.tolerances.fp16.rel_l2", "not a positive finite number"]),
    ("model: {variant: yolo12n}\nverification:\n  tolerances:\n    fp16:\n      parts: {scores: {cosine: 1.5}}\n",
     [":5:", "verification.tolerances.fp16.parts.scores.cosine", "(0, 1]"]),
    ("model: {variant: yolo12n}\nverification:\n  tolerances:\n    fp16:\n      parts: {boxs: {rel_l2: 0.1}}\n",
     [":3:", "verification.tolerances", "unknown tolerance 'fp16.boxs.rel_l2' for yolo"]),
    ("model: {variant: yolo12n}\nverification:\n  tolerances:\n    fp4: {rel_l2: 0.1}\n",
     [":4:", "verification.tolerances.fp4", "unknown precision 'fp4'"]),
    ("model: {variant: yolo12n}\nverification:\n  tolerances:\n    int8:\n      task: {recall: 1.2}\n",
     [":5:", "verification.tolerances.int8.task.recall", "[0, 1]"]),
    ("model: {variant: yolo12n}\nweights: a.pt\n", [":2:", "unknown key 'weights'", "model.weights?"]),
    ("model: {variant: yolo12n, weights: missing.pt}\n", [":1:", "model.weights", "not found"]),
    ("model: {variant: yolo12n}\nprecisions: [fp16]\nprecisions: [int8]\n", [":3:", "'precisions' is given twice"]),
    ("model: {variant: yolo12n}\ntargets: ['8.6']\n", [":2:", "targets[0]", "need trt: tensorrt-rtx"]),
    ("model: [yolo12n\n", [":2:", "malformed YAML"]),
    ("model: {variant: yolo12n}\nprecisions: [fp16, fp16]\n", [":2:", "precisions[1]", "listed twice"]),
    ("model: {variant: yolo12n}\ncalibration:\n  method: avg\n", [":3:", "calibration.method", "'avg'", "entropy"]),
    ("model: {variant: yolo12n}\ncalibration:\n  exclude:\n    - a\n    - '('\n", [":5:", "calibration.exclude[1]"]),
    ("model: {variant: yolo12n}\nbuilder:\n  workspace: lots\n", [":3:", "builder.workspace", "malformed size"]),
    ("model: {variant: yolo12n}\nverification:\n  tolerances:\n    fp16:\n      task: {abs_rel: 1}\n",
     [":5:", "verification.tolerances.fp16.task.abs_rel", "unknown task metric"]),
    ("model: {variant: yolo12n}\nprofiles: [1x3x640x640]\nprecisons: [fp16]\ncalibration: {method: avg}\n",
     [":3:", "unknown key 'precisons'", "(and 1 more)"]),  # the schema's error before a check's
])
def test_more_recipe_problems(tmp_path, text, needles):
    from enginekit.errors import UsageError
    from enginekit.recipes import load_recipe

    path = write(tmp_path, "r.yaml", text)
    with pytest.raises(UsageError) as err:
        load_recipe(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path))
    for needle in needles:
        assert needle in message, message


# --- flags override the file -------------------------------------------------------------


def test_flags_override_the_file(tmp_path):
    from enginekit.recipes import load_recipe

    (tmp_path / "w").mkdir()
    write(tmp_path / "w", "calib", "")
    recipe = load_recipe(write(tmp_path, "r.yaml", TINY_RECIPE + "calibration: {data: w/calib, count: 4}\n"))
    request = recipe.build_request("int8")
    assert request.target_cc == "8.6" and request.random_init and request.profiles == ["1x3x256x256"]
    assert request.calib_data == tmp_path / "w" / "calib"  # relative to the recipe file
    # an uncalibrated cell takes none of the recipe's calibration (a BuildRequest refuses --calib-* there)
    assert recipe.build_request("fp32").calib_data is None
    overrides = {"precision": "int8", "target_cc": "8.9,8.6", "weights": Path("best.pt"), "calib_count": 2}
    (cell,) = recipe.cells(overrides)
    assert (cell.precision, cell.targets) == ("int8", ("8.6", "8.9"))
    request = recipe.build_request(cell, overrides)
    assert request.weights == Path("best.pt") and not request.random_init and request.calib_count == 2
    assert request.precision == "int8" and request.target_cc == "8.6,8.9"
    fp16 = recipe.build_request(recipe.cells({**overrides, "precision": "fp16"})[0], {**overrides, "precision": "fp16"})
    assert fp16.calib_count == 8 and fp16.calib_data is None  # --calib-count is for the calibrated cells


def test_the_old_key_backend_is_read_as_trt_with_a_warning(tmp_path):
    """``backend:`` named the TensorRT that builds until ``trt:`` (``--trt``): a recipe written before is read the
    same, with one warning; both keys, disagreeing, are refused naming the file and key."""
    from enginekit import reporting
    from enginekit.errors import UsageError
    from enginekit.recipes import load_recipe

    old = TINY_RECIPE.replace("trt: tensorrt-rtx", "backend: tensorrt-rtx")
    with reporting.collecting() as seen:
        recipe = load_recipe(write(tmp_path, "old.yaml", old))
    assert recipe.trt == "tensorrt-rtx" and recipe.build_request("fp32").flavour == "tensorrt-rtx"
    assert [w for w in seen.warnings if "trt: tensorrt-rtx" in w], seen.warnings
    with pytest.raises(UsageError, match="backend: tensorrt disagree|disagree"):
        load_recipe(write(tmp_path, "both.yaml", old + "trt: tensorrt\n"))
    assert load_recipe(write(tmp_path, "new.yaml", TINY_RECIPE)).build_request("fp32").flavour == "tensorrt-rtx"


def test_build_and_verify_read_the_old_flag_backend_as_trt(run_cli, tmp_path):
    """``--backend`` on build and verify (the TensorRT flavour; ``--trt`` now) is still read, with one warning line,
    and refused where it disagrees with --trt; on predict, bench and tune --backend is a runtime backend."""
    from enginekit.cli.common import engine_request
    from enginekit import reporting
    from enginekit.errors import UsageError

    base = {"trt": "auto", "backend": None, "target_cc": None, "workspace": None, "opt_level": None, "calib_data": None,
            "calib_count": 8, "calib_method": None, "calib_cache": None, "exclude": None}
    assert engine_request({**base, "trt": "tensorrt-rtx"})["flavour"] == "tensorrt-rtx"
    with reporting.collecting() as seen:
        assert engine_request({**base, "backend": "tensorrt-rtx"})["flavour"] == "tensorrt-rtx"
    assert any("--trt tensorrt-rtx" in w for w in seen.warnings), seen.warnings
    with pytest.raises(UsageError, match="disagree"):
        engine_request({**base, "trt": "tensorrt", "backend": "tensorrt-rtx"})
    # through the command line: the old flag read (its warning), then what the flavour refuses, exit 2
    env = {"ENGINEKIT_CACHE": str(tmp_path / "c")}
    result = run_cli("build", "yolo12n", "--random-init", "--backend", "tensorrt-rtx", "--target-cc", "9.0", env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.code == 2 and "9.0" in lines[-1] and lines[-1].startswith("error:"), result.stderr
    assert "it is --trt now (--trt tensorrt-rtx)" in result.stderr
    # a value no flavour has: the one error line, nothing before it
    result = run_cli("build", "yolo12n", "--random-init", "--backend", "trt", env=env)
    assert [line for line in result.stderr.splitlines() if line.strip()] == \
        ["error: unknown TensorRT flavour 'trt': choose auto, tensorrt, tensorrt-rtx (--backend is --trt's old name)"]
    result = run_cli("verify", "yolo12n", "--random-init", "--trt", "tensorrt", "--backend", "tensorrt-rtx",
                     env={"ENGINEKIT_CACHE": str(tmp_path / "c")})
    assert result.code == 2 and "disagree" in result.stderr, result.stderr


# --- CI matrix and workflows ---------------------------------------------------------------


def expected_cells() -> set[tuple[str, str, str]]:
    from enginekit.recipes import load_recipe

    cells = set()
    for path in SHIPPED:
        for cell in load_recipe(path).cells():
            cells.add((f"recipes/{path.name}", cell.precision, cell.targets_label))
    return cells


def test_matrix_covers_every_recipe_cell(run_cli):
    github = run_cli("matrix", "recipes/", "--format", "github", cwd=REPO)
    assert github.code == 0, github.stderr
    assert len(github.stdout.strip().splitlines()) == 1  # one line, as $GITHUB_OUTPUT needs
    jobs = json.loads(github.stdout)["include"]
    got = [(j["recipe"], j["precision"], j["targets"]) for j in jobs]
    assert len(got) == len(set(got)) and set(got) == expected_cells()
    plain = run_cli("matrix", "recipes/", "--format", "json", cwd=REPO)
    assert json.loads(plain.stdout) == jobs


def test_matrix_refuses_a_bad_recipe_before_any_work(run_cli, tmp_path):
    write(tmp_path, "ok.yaml", TINY_RECIPE)
    write(tmp_path, "bad.yaml", TINY_RECIPE.replace("precisions:", "precision:"))
    assert_one_line_error(run_cli("matrix", "."), 2, "bad.yaml:6:", "unknown key 'precision'", "precisions?")


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_parses_and_uses_the_matrix(path):
    text = path.read_text()
    workflow = yaml.safe_load(text)
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    if path.name == "nightly.yml":
        assert "schedule" in triggers and "workflow_dispatch" in triggers
    else:
        assert "pull_request" in triggers
    jobs = workflow["jobs"]
    plan_steps = " ".join(str(s.get("run", "")) for s in jobs["plan"]["steps"])
    assert "enginekit matrix recipes/ --format github" in plan_steps and "$GITHUB_OUTPUT" in plan_steps
    (matrix_job,) = [j for j in jobs.values() if "strategy" in j]
    assert matrix_job["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert matrix_job["needs"] == "plan"
    steps = " ".join(str(s.get("run", "")) for s in matrix_job["steps"])
    assert "enginekit build" in steps and "enginekit verify" in steps
    used = set(re.findall(r"(?<![.\w])matrix\.(\w+)", text))  # not steps.matrix.outputs
    keys = {"recipe", "name", "precision", "targets"}
    assert {"recipe", "precision", "targets"} <= used and used <= keys, used - keys


# --- make ------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_nightly_builds_and_verifies_every_recipe():
    done = subprocess.run(["make", "-n", "nightly"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for path in SHIPPED:
        assert f"enginekit build recipes/{path.name}" in done.stdout
        assert f"enginekit verify recipes/{path.name} --report reports/{path.stem}/" in done.stdout
    for target in ("engines", "verify", "clean-cache"):
        assert subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, timeout=60).returncode == 0


# --- building a recipe ---------------------------------------------------------------------


def test_build_recipe_then_all_cache_hits(run_cli, tmp_path):
    (tmp_path / "recipes").mkdir()
    write(tmp_path / "recipes", "tiny.yaml", TINY_RECIPE)
    listed = run_cli("recipes", "ls")
    assert listed.code == 0 and "tiny" in listed.stdout and "local" in listed.stdout
    shown = run_cli("recipes", "show", "tiny")
    assert shown.code == 0 and "family: yolo" in shown.stdout, shown.stderr

    first = run_cli("build", "recipes/tiny.yaml")
    assert first.code == 0, first.stderr
    engine = Path(first.stdout.strip())
    assert engine.is_file() and engine.stat().st_size > 100_000
    second = run_cli("build", "recipes/tiny.yaml")
    assert second.code == 0, second.stderr
    assert Path(second.stdout.strip()) == engine
    assert "cached" in second.stderr and "built" not in second.stderr, second.stderr


def test_verify_request_builds_the_cell_and_lets_the_command_line_win(tmp_path):
    from enginekit.compare.comparison import Gates
    from enginekit.recipes import load_recipe

    recipe = load_recipe(write(tmp_path, "r.yaml", TINY_RECIPE + (
        "verification:\n  tolerances:\n    int8:\n      rel_l2: 0.3\n      task: {map50: 0.5, recall: 0.6}\n")))
    request = recipe.verify_request("int8", {"tolerances": ["int8.map50=0.3"], "junit": Path("j.xml")})
    assert request.kind == "model" and request.junit == Path("j.xml")
    assert request.build_request == recipe.build_request("int8")  # the engine the build made
    gates = Gates(recipe.adapter(), request.tolerances)  # the gates verify applies
    assert gates.task("int8")["map50"] == (">=", 0.3)  # the command line's --tol wins over the file
    assert gates.task("int8")["recall"] == (">=", 0.6) and gates.parity("int8", "boxes").rel_l2 == 0.3
    assert gates.task("fp16") == Gates(recipe.adapter()).task("fp16")  # other precisions keep the family's
    assert recipe.tolerance("int8").rel_l2 == 0.3 and recipe.task_gates("int8")["map50"] == (">=", 0.5)


def test_a_bad_override_is_a_one_line_usage_error():
    from enginekit.errors import UsageError
    from enginekit.recipes import load_recipe

    recipe = load_recipe(REPO / "recipes" / "yolo12n.yaml")
    with pytest.raises(UsageError, match="--calib-count") as err:
        recipe.build_request("int8", {"calib_count": 0})
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="unknown tolerance 'map5'"):
        recipe.verify_request("int8", {"tolerances": ["int8.map5=0.3"]})


def test_recipe_labels_go_to_verify(tmp_path):
    """verification.data (and its split, limit and label limits) reach verify --data's request and gates."""
    from enginekit.compare.comparison import Gates
    from enginekit.recipes import load_recipe

    (tmp_path / "data.yaml").write_text("path: .\nval: images\nnames:\n  0: a\n")
    recipe = load_recipe(write(tmp_path, "r.yaml", TINY_RECIPE + (
        "verification:\n  data: data.yaml\n  data_limit: 50\n"
        "  tolerances:\n    int8:\n      labels: {map50_95_drop: 0.02}\n")))
    request = recipe.verify_request("int8", {})
    assert request.data == tmp_path / "data.yaml" and request.data_limit == 50 and (request.data_split or "val") == "val"
    gates = Gates(recipe.adapter(), request.tolerances)
    assert gates.ground_truth("int8")["map50_95_drop"] == 0.02
    assert gates.ground_truth("fp16")["map50_95_drop"] == 0.01  # the family's default elsewhere


#: verified at a small size by the test below; the larger Depth-Anything's cell is the small one's with other weights
#: (a 97M-parameter export costs CI four minutes), which the test after it holds to
CATALOGUE = [p for p in SHIPPED if p.stem != "depth-anything-v2-base"]


@pytest.mark.slow
@pytest.mark.parametrize("path", CATALOGUE, ids=lambda p: p.stem)
def test_every_shipped_recipe_passes_its_own_verify_at_a_small_size(path, run_cli, tmp_path):
    """What ``make nightly`` gates on, cheaply: each shipped recipe's verify (every precision it lists, its gates, its
    calibration) at a small input, judging the graphs it makes (verify builds no engine). A recipe that stops passing
    fails here, in CI, before a nightly does. A random-weight detector finds 12 instances on the embedded photographs
    at 96, 54 to 62 at 320 and about 110 at 640: a share's 95% interval clears the 5% rule from 72 detections on, so
    the detectors run at their own 640, the segmenter and pose model (more instances) at 320."""
    from enginekit.recipes import load_recipe

    recipe = load_recipe(path)
    family = recipe.adapter().family
    size = "70" if family.startswith("depth") else "640" if family == "yolo" else "320"
    result = run_cli("verify", str(path), "--imgsz", size, env={"ENGINEKIT_CACHE": str(tmp_path / "cache")},
                     timeout=900)
    assert result.code == 0, result.stderr[-3000:]
    for precision in recipe.precisions:
        assert f"({precision})" in result.stderr or precision in result.stderr, (precision, result.stderr[-2000:])


def test_the_larger_depth_recipe_is_the_small_ones_fp16_cell_with_other_weights():
    """What lets the catalogue test above leave Depth-Anything-V2-Base out: the same family, precision, gates,
    images, profiles and targets as the small recipe's FP16 cell; only the variant (its weights) differs."""
    from enginekit.recipes import load_recipe

    base, small = (load_recipe(REPO / "recipes" / f"depth-anything-v2-{v}.yaml") for v in ("base", "small"))
    assert base.precisions == ["fp16"] and "fp16" in small.precisions
    one, other = base.verify_request("fp16"), small.verify_request("fp16")
    assert one.build.target == "depth-anything-v2-base" and other.build.target == "depth-anything-v2-small"
    mine = one.model_dump(exclude={"build", "target"})
    theirs = other.model_dump(exclude={"build", "target"})
    assert mine == theirs
    assert one.build.model_dump(exclude={"target"}) == other.build.model_dump(exclude={"target"})
    assert base.gates().parity("fp16") == small.gates().parity("fp16")
    assert base.gates().task("fp16") == small.gates().task("fp16")
