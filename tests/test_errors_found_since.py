"""The bad inputs found since the last release: deploy locations and environments, sizes, the Python API's types,
damaged stored records, special files in a labelled split, and the labelling step's NMS. One ``error:`` line with
the documented exit code (or a documented warning and a result), no traceback, nothing written outside the paths
named, nothing left in the cache's .tmp.

Each class is a property (Hypothesis draws its members) where it has several, a plain test where it has one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

from test_errors_properties import PROPERTY, assert_refused, invoke  # noqa: E402


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- deploy: locations and environments


@pytest.fixture(scope="module")
def deploy_world(tmp_path_factory):
    """A cache where yolo12n's graph at 64 px is exported once, and a venv-like folder without enginekit."""
    root = tmp_path_factory.mktemp("deploy")
    env = {"ENGINEKIT_CACHE": str(root / "cache")}
    run = invoke(["export", "yolo12n", "--random-init", "--imgsz", "64", "-o", str(root / "y.onnx")], env=env)
    assert run.code == 0, run
    bare = root / "bare-env" / "bin"
    bare.mkdir(parents=True)
    os.symlink(sys.executable, bare / "python")  # a Python, but enginekit is importable only through PYTHONPATH
    return root, env


ENVIRONMENTS = {
    "missing": lambda root: root / "no-such-venv",
    "a file": lambda root: root / "y.onnx",
    "no python": lambda root: root,
}


@PROPERTY
@given(case=st.sampled_from(sorted(ENVIRONMENTS)), platform=st.sampled_from(["python", "onnxruntime"]))
def test_a_python_environment_that_cannot_run_the_models_is_refused_before_writing(deploy_world, case, platform):
    root, env = deploy_world
    repo = root / f"repo-{case.replace(' ', '-')}-{platform}"
    run = invoke(["deploy", "triton", "yolo12n", "--random-init", "--imgsz", "64", "--platform", platform,
                  "--python-env", str(ENVIRONMENTS[case](root)), "--repo", str(repo)], env=env)
    line = assert_refused(run)
    assert "--python-env" in line
    assert not repo.exists()


def test_an_environment_without_enginekit_is_refused(deploy_world):
    root, env = deploy_world
    run = invoke(["deploy", "triton", "yolo12n", "--random-init", "--imgsz", "64", "--python-env",
                  str(root / "bare-env"), "--repo", str(root / "repo-bare")], env={**env, "PYTHONPATH": ""})
    line = assert_refused(run)
    assert "does not hold enginekit" in line or "Python" in line, line
    assert not (root / "repo-bare").exists()


@PROPERTY
@given(theirs=st.sampled_from(["README.md", "other-model/config.pbtxt", "notes.txt", "README.md/"]))
def test_deploy_never_replaces_a_file_it_did_not_write(deploy_world, theirs):
    """A repository holding the user's own files (their README, another model): deploy adds its two models and
    leaves every file of theirs byte for byte; its own README is written only where none of theirs stands."""
    root, env = deploy_world
    repo = root / f"repo-{abs(hash(theirs))}"
    shutil.rmtree(repo, ignore_errors=True)
    target = repo / theirs.rstrip("/")
    if theirs.endswith("/"):
        target.mkdir(parents=True)
        (target / "mine.txt").write_text("a folder named README.md, the user's")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("the user's own words\n")
    before = _tree(repo)
    run = invoke(["deploy", "triton", "yolo12n", "--random-init", "--imgsz", "64", "--repo", str(repo)], env=env)
    assert run.code == 0, run
    after = _tree(repo)
    assert {k: v for k, v in after.items() if k in before} == before
    assert (repo / "yolo12n" / "config.pbtxt").is_file() and (repo / "yolo12n-net" / "config.pbtxt").is_file()
    if not theirs.startswith("README.md"):  # nothing of theirs stands there: deploy's own index
        assert (repo / "README.md").is_file() and "enginekit deploy triton" in (repo / "README.md").read_text()
    again = invoke(["deploy", "triton", "yolo12n", "--random-init", "--imgsz", "64", "--repo", str(repo)], env=env)
    assert again.code == 0 and {k: v for k, v in _tree(repo).items() if k in before} == before


# --------------------------------------------------------------------------- sizes


@PROPERTY
@given(size=st.sampled_from(["2x1x320x320", "1x3x320x320", "1000000000", "100000x100000", "0", "320x", "x320",
                             "3x320x320", "-5", "1e3"]),
       verb=st.sampled_from(["export", "predict", "build"]))
def test_a_size_is_n_or_hxw_and_fits_in_memory(tmp_path_factory, size, verb):
    """``--imgsz`` takes N or HxW: a batch and channels (NxCxHxW) are ``--input``'s and named so; a size whose one
    image would not fit in memory is refused before any work; nothing is written."""
    import ultralytics

    tmp = tmp_path_factory.mktemp("size")
    photo = str(Path(ultralytics.__file__).parent / "assets" / "bus.jpg")
    args = {"export": ["export", "yolo12n", "--random-init", "-o", str(tmp / "x.onnx")],
            "predict": ["predict", "yolo12n", photo, "--random-init", "--save", str(tmp / "out")],
            "build": ["build", "yolo12n", "--random-init"]}[verb]
    run = invoke([*args, "--imgsz", size], env={"ENGINEKIT_CACHE": str(tmp / "cache")})
    line = assert_refused(run)
    assert "--imgsz" in line or "imgsz" in line
    if size in ("2x1x320x320", "1x3x320x320"):
        assert "--input" in line
    assert not any((tmp / n).exists() for n in ("x.onnx", "out")) and not (tmp / "cache").exists()


# --------------------------------------------------------------------------- the Python API's types

API_CASES = {
    "random_init": "yes please", "seed": True, "max_det": 2.5, "conf": "0.3", "quiet": "no", "gpu_letterbox": 1,
    "device": 0, "imgsz": 320.5, "cuda_graph": "auto",
}


@PROPERTY
@given(name=st.sampled_from(sorted(API_CASES)))
def test_load_checks_types_as_the_cli_does(name):
    import enginekit
    from enginekit.errors import UsageError

    with pytest.raises(UsageError, match=name):
        enginekit.load("yolo12n", backend="onnxruntime-cpu", **{name: API_CASES[name]})


@PROPERTY
@given(verb=st.sampled_from(["export", "build", "verify"]), value=st.sampled_from(["yes please", "maybe", 2, "1.0"]))
def test_the_api_verbs_take_booleans_only(verb, value):
    from enginekit import api
    from enginekit.errors import UsageError

    with pytest.raises((UsageError, ValueError)):
        getattr(api, verb)("yolo12n", random_init=value, quiet=True)


# --------------------------------------------------------------------------- stored records


WRONG = {"str": "damaged", "int": 7, "list": [1, 2], "null": None, "bool": True, "float": 0.5, "dict": {"x": 1}}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Every kind of record an export, an FP16 and an INT8 build and a verify with labels store (yolo12n at 64)."""
    from enginekit import api
    from enginekit.cache import Cache

    root = tmp_path_factory.mktemp("records")
    cache = Cache(root / "cache")
    api.export("yolo12n", random_init=True, fp16=True, imgsz=64, output=root / "y.onnx", cache=cache, quiet=True)
    api.build("yolo12n", random_init=True, precision="int8", imgsz=64, cache=cache, quiet=True, verify=False)
    api.verify("yolo12n", precision="fp16", build_options={"random_init": True, "profiles": ["1x3x64x64"]},
               cache=cache, quiet=True, task_required=False)
    return root, cache


def test_every_record_kind_and_field_is_checked(stored):
    """Fuzz every field of every stored record kind the runs made. A field a reader takes (``RECORDS``), of each wrong
    JSON type in turn: the record reads as corrupt, never as a hit a reader would crash on. Every field no reader
    takes, damaged all at once in every entry: the same runs again still pass, from the cache."""
    from enginekit import api
    from enginekit.manifest import RECORDS, RESERVED_FIELDS, check_manifest

    root, cache = stored
    kinds: dict[str, list[Path]] = {}
    for kind, key, path in cache._entry_dirs():
        kinds.setdefault(kind, []).append(path)
    assert {"onnx-export", "onnx-simplify", "onnx-fp16", "onnx-int8", "parity", "reference", "engine",
            "verdict"} <= set(kinds), sorted(kinds)
    checked = unread = 0
    for kind, paths in kinds.items():
        for path in paths:
            manifest = json.loads((path / "manifest.json").read_text())
            assert check_manifest(manifest, kind, manifest["key"]) is None, kind
            declared = RECORDS.get(kind, {})
            for field in [f for f in manifest if f not in RESERVED_FIELDS]:
                if field not in declared:
                    manifest[field] = {"damaged": [None]}
                    unread += 1
                    continue
                for label, value in WRONG.items():
                    types = declared[field]
                    fits = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
                    if fits:
                        continue
                    reason = check_manifest({**manifest, field: value}, kind, manifest["key"])
                    assert reason is not None and field in reason, (kind, field, label)
                    checked += 1
            (path / "manifest.json").write_text(json.dumps(manifest))  # only fields no reader takes changed
    assert checked > 50 and unread > 5, (checked, unread)
    again = api.export("yolo12n", random_init=True, fp16=True, imgsz=64, output=root / "again.onnx", cache=cache,
                       quiet=True)
    assert again.passed and all(a.status == "hit" for a in again.artifacts)
    assert api.build("yolo12n", random_init=True, precision="int8", imgsz=64, cache=cache, quiet=True,
                     verify=False).status == "hit"
    assert api.verify("yolo12n", precision="fp16", build_options={"random_init": True, "profiles": ["1x3x64x64"]},
                      cache=cache, quiet=True, task_required=False).passed


@settings(PROPERTY, max_examples=min(PROPERTY.max_examples, 6))  # each example exports again: seconds each
@given(kind=st.sampled_from(["parity", "onnx-export", "onnx-fp16"]), value=st.sampled_from(list(WRONG)))
def test_a_damaged_record_is_a_miss_with_one_warning_then_rebuilt(stored, tmp_path_factory, kind, value):
    """The issue's case and its kin: a field a reader takes, of the wrong type, in every record of a kind the export
    reads; the next export warns once per record, rebuilds each and exits 0."""
    from enginekit.manifest import RECORDS

    root, cache = stored
    declared = RECORDS[kind]
    damaged = []
    for k, _, entry in cache._entry_dirs(kind):
        manifest = json.loads((entry / "manifest.json").read_text())
        if "at" in manifest.get("parts", {}):  # a build's verdict: not what an export reads
            continue
        field = next(f for f in declared if f in manifest)
        def fits(v, types=declared[field]):
            return isinstance(v, types) and not (isinstance(v, bool) and bool not in types)

        wrong = WRONG[value] if not fits(WRONG[value]) else next(v for v in WRONG.values() if not fits(v))
        manifest[field] = wrong
        (entry / "manifest.json").write_text(json.dumps(manifest))
        damaged.append((entry, field, wrong))
    assert damaged
    out = tmp_path_factory.mktemp("again") / "y.onnx"
    run = invoke(["export", "yolo12n", "--random-init", "--fp16", "--imgsz", "64", "-o", str(out)],
                 env={"ENGINEKIT_CACHE": str(cache.root)})
    assert run.code == 0 and run.exception is None, run
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert warnings and all("corrupt" in w and "its record" in w for w in warnings), run.stderr
    assert len(warnings) <= len(damaged) and out.is_file()
    for entry, field, wrong in damaged:
        if (entry / "manifest.json").is_file():  # the entries the export read are there again, rebuilt
            assert json.loads((entry / "manifest.json").read_text()).get(field) != wrong


# --------------------------------------------------------------------------- special files in a labelled split


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    from trained_detector import write_dataset

    root = tmp_path_factory.mktemp("labelled")
    data = write_dataset(root / "data", {"train_images": 2, "val_images": 4, "size": 64, "objects": (1, 2),
                                         "side_px": (12, 24), "seed": 3})
    return data


@PROPERTY
@given(kind=st.sampled_from(["fifo", "socket", "device"]), where=st.sampled_from(["images/val", "images/val/sub"]))
def test_a_special_file_among_a_splits_images_is_refused_not_skipped(labelled, tmp_path_factory, kind, where):
    import socket

    root = tmp_path_factory.mktemp("special")
    data_root = root / "data"
    shutil.copytree(labelled.parent, data_root)
    yaml_path = data_root / labelled.name
    yaml_path.write_text(yaml_path.read_text().replace(str(labelled.parent), str(data_root)))
    folder = data_root / where
    folder.mkdir(parents=True, exist_ok=True)
    special = folder / "odd.jpg"
    if kind == "fifo":
        os.mkfifo(special)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(special))
    else:
        os.symlink("/dev/zero", special)
    run = invoke(["verify", "yolo12n", "--random-init", "--imgsz", "64", "--data", str(yaml_path)],
                 env={"ENGINEKIT_CACHE": str(root / "cache")})
    line = assert_refused(run)
    assert "odd.jpg" in line and "not a regular file" in line
    tmp = root / "cache" / ".tmp"
    assert not tmp.exists() or not list(tmp.iterdir())


# --------------------------------------------------------------------------- the labelling step's NMS


def test_the_labelling_nms_is_torchvisions_whatever_was_imported_before():
    """Ultralytics' NMS uses torchvision's kernel only where torchvision is imported, else a Python loop 10-30x
    slower: enginekit's decoding takes the fast one in a process that never imported torchvision itself."""
    code = (
        "import sys, numpy as np\n"
        "assert 'torchvision' not in sys.modules\n"
        "import ultralytics.utils.nms as n\n"
        "def slow(*a, **k): raise SystemExit('the slow Python NMS ran')\n"
        "n.TorchNMS.nms = staticmethod(slow)\n"
        "from enginekit.families.ultralytics.yolo import nms_rows\n"
        "scale = np.array([640, 640, 60, 60, 1, 1, 1], np.float32)[None, :, None]\n"
        "rows = nms_rows(np.random.default_rng(0).random((1, 7, 400), dtype=np.float32) * scale, 0.001, nc=3)\n"
        "print(len(rows[0]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.strip()) > 0


# --------------------------------------------------------------------------- nothing left in .tmp


def test_a_killed_runs_staging_folder_goes_with_the_next_build(tmp_path):
    """SIGKILL leaves a run no time to clean up: its staging folder (its pid dead) is removed by the next build."""
    from enginekit.cache import Cache

    cache = Cache(tmp_path / "cache")
    orphan = tmp_path / "cache" / ".tmp" / f"ground-truth-{'a' * 64}-999999-0badcafe"
    orphan.mkdir(parents=True)
    (orphan / "half.json").write_text("{")
    cache.get_or_create("parity", {"x": 1}, lambda tmp: {"result": {}, "passed": True})
    assert not orphan.exists() and list((tmp_path / "cache" / ".tmp").iterdir()) == []


def test_sigterm_during_the_labels_scoring_leaves_nothing_in_tmp(tmp_path, trained_detector):
    """verify --data, terminated while it scores a candidate against the labels: exit 143, .tmp empty."""
    import signal
    import time

    from trained_detector import write_dataset

    data = write_dataset(tmp_path / "data", {"train_images": 1, "val_images": 48, "size": 320, "objects": (2, 4),
                                             "side_px": (20, 60), "seed": 5})
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "enginekit", "verify", str(trained_detector.weights), "--imgsz",
                             "320", "--data", str(data)], env={**os.environ, "ENGINEKIT_CACHE": str(cache)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, seen = time.time() + 600, False
    while time.time() < deadline and proc.poll() is None:
        tmp = cache / ".tmp"
        if tmp.is_dir() and any(p.name.startswith("ground-truth-") for p in tmp.iterdir()):
            seen = True
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=300)
    if not seen:
        pytest.skip(f"the scoring finished before it could be interrupted (exit {proc.returncode})")
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    assert not (cache / ".tmp").exists() or list((cache / ".tmp").iterdir()) == []
