"""Bad inputs and faults on the newest verbs (the stream, the team store, user code, tune, --data): one ``error:``
line, the documented exit code, no traceback, nothing hangs, nothing written outside the paths the user named.

One section per class of failure; each is a property (Hypothesis draws the case from its class) where the
class has several members, and a plain test where it has one. Cases run in this process (``invoke``) where
they load no model; a model that runs the user's code or a stream runs as a user runs it, in a new process.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

from conftest import assert_one_line_error  # noqa: E402
from test_errors_properties import PROPERTY, assert_refused, invoke  # noqa: E402

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # a machine without a GPU, on any machine


# --------------------------------------------------------------------------- 1. a failing model is an error

LATE = '''
import torch


class Net(torch.nn.Module):
    """Fails on a batch of one frame: loading it (a batch of two) works, a stream's first frame does not."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        if x.shape[0] == 1:
            raise ValueError(f"no batch of one: {tuple(x.shape)}")
        return self.c(x)


def make():
    return Net()
'''


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> Path:
    import ultralytics

    path = tmp_path_factory.mktemp("photo") / "bus.jpg"  # 810x1080: not square
    path.write_bytes((Path(ultralytics.__file__).parent / "assets" / "bus.jpg").read_bytes())
    return path


def test_a_model_failing_on_its_first_frame_fails_predict(tmp_path, run_cli, photo):
    """It printed "0 frame(s)", exited 0 and wrote an empty results.json: nothing found, as far as anyone knew."""
    (tmp_path / "late.py").write_text(LATE)
    (tmp_path / "late.yaml").write_text("model:\n  variant: late.py:make\n  task: semantic\n  size: 64x64\n"
                                        "  random_init: true\nruntime:\n  backend: torch\n")
    result = run_cli("predict", "late.yaml", str(photo), "--save", "out", env=NO_GPU)
    assert_one_line_error(result, 2, "late.py:make", "no batch of one: (1, 3, 64, 64)")
    assert not (tmp_path / "out").exists()
    assert "frame(s)" not in result.stderr + result.stdout


def test_a_runtime_input_the_model_cannot_take_is_refused_where_it_is_written(tmp_path):
    """A YOLO at 321x321 ran into ONNX Runtime's Concat on its first frame; now the recipe itself is refused."""
    (tmp_path / "r.yaml").write_text("model:\n  variant: yolov8n\n  random_init: true\nruntime:\n  input: 321x321\n")
    line = assert_refused(invoke(["recipes", "show", str(tmp_path / "r.yaml")]))
    assert "r.yaml:5: runtime.input" in line and "321 is not a multiple of 32" in line and "320 or 352" in line
    from enginekit import api
    from enginekit.errors import UsageError

    with pytest.raises(UsageError, match="321 is not a multiple of 32"):
        api.load("yolov8n", random_init=True, input_size=321, backend="onnxruntime-cpu")


# --------------------------------------------------------------------------- 2. special files never block


@pytest.fixture(scope="module")
def folder_store(tmp_path_factory):
    """A folder store holding one entry, whose manifest and blob can be swapped for special files."""
    from enginekit.cache import Cache
    from enginekit.store.settings import RemoteSettings
    from enginekit.store.tier import Remote

    root = tmp_path_factory.mktemp("fstore")
    (root / "store").mkdir()
    url = f"file://{root / 'store'}"

    def produce(tmp: Path) -> dict:
        (tmp / "model.onnx").write_bytes(b"graph" * 100)
        return {}

    entry, _ = Cache(root / "cache", remote=Remote(RemoteSettings(url))).get_or_create(
        "onnx-export", {"stage": "special-files"}, produce)
    return root / "store", entry.key


def _special(path: Path, kind: str) -> None:
    """Make ``path`` a FIFO nobody writes to, or a link to an endless device."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(kind)


@PROPERTY
@given(which=st.sampled_from(["manifest", "blob"]), kind=st.sampled_from(["fifo", "/dev/zero"]),
       verb=st.sampled_from(["ls", "pull"]))
def test_a_special_file_in_a_folder_store_is_one_line(folder_store, tmp_path_factory, which, kind, verb):
    """It hung ``cache ls --remote`` and ``cache pull`` (and a build through the store) on open()."""
    import shutil

    store, key = folder_store
    copy = tmp_path_factory.mktemp("fstore-copy") / "store"
    shutil.copytree(store, copy, symlinks=True)
    target = next(copy.glob(f"entries/onnx-export/{key}.json")) if which == "manifest" else \
        next(p for p in copy.glob("blobs/sha256/*/*"))
    _special(target, kind)
    cache = tmp_path_factory.mktemp("empty-cache")
    args = ["cache", "ls", "--remote", f"file://{copy}"] if verb == "ls" else \
        ["cache", "pull", key[:12], "--remote", f"file://{copy}"]
    run = invoke(args, env={"ENGINEKIT_CACHE": str(cache)})
    if verb == "ls" and which == "blob":
        assert run.code == 0, repr(run)  # listing reads manifests, never blobs
        return
    line = assert_refused(run, (2, 3))
    assert "not a regular file" in line or "sha256" in line or "bytes" in line, line
    assert not [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock")], "half an entry kept"


def test_a_build_through_a_store_with_a_fifo_manifest_builds_here(folder_store, tmp_path):
    """The store is skipped after one warning; the entry is made locally; no temporary entry is left."""
    import shutil

    from enginekit import reporting
    from enginekit.cache import Cache
    from enginekit.store.settings import RemoteSettings
    from enginekit.store.tier import Remote

    store, key = folder_store
    shutil.copytree(store, tmp_path / "store")
    _special(tmp_path / "store" / "entries" / "onnx-export" / f"{key}.json", "fifo")
    cache = Cache(tmp_path / "cache", remote=Remote(RemoteSettings(f"file://{tmp_path / 'store'}")))
    with reporting.collecting() as events:
        entry, status = cache.get_or_create("onnx-export", {"stage": "special-files"},
                                            lambda tmp: (tmp / "model.onnx").write_bytes(b"here") and {})
    assert status == "miss" and entry.file("model.onnx").read_bytes() == b"here"
    assert any("not a regular file" in e.label for e in events.events), [e.label for e in events.events]
    assert not list((tmp_path / "cache" / ".tmp").iterdir())


@PROPERTY
@given(case=st.sampled_from(["dataset", "image-list", "calib-cache", "label", "engine-manifest", "recipe"]),
       kind=st.sampled_from(["fifo", "/dev/zero"]))
def test_every_file_enginekit_reads_refuses_a_special_file(tmp_path_factory, case, kind):
    """``verify --data fifo.yaml`` hung; so did a FIFO image list, calibration cache, label file, engine manifest."""
    root = tmp_path_factory.mktemp("specials")
    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    import ultralytics

    image = root / "images" / "val" / "bus.jpg"
    image.write_bytes((Path(ultralytics.__file__).parent / "assets" / "bus.jpg").read_bytes())
    (root / "labels" / "val" / "bus.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (root / "data.yaml").write_text(f"path: {root}\nval: images/val\nnames: [a]\n")
    if case == "dataset":
        _special(root / "data.yaml", kind)
        from enginekit.datasets import load_dataset as read
        args = (root / "data.yaml",)
    elif case == "image-list":
        (root / "data.yaml").write_text(f"path: {root}\nval: val.txt\nnames: [a]\n")
        _special(root / "val.txt", kind)
        from enginekit.datasets import load_dataset

        def read(path):
            return load_dataset(path).images("val")
        args = (root / "data.yaml",)
    elif case == "calib-cache":
        _special(root / "x.calib", kind)
        from enginekit.stages.int8 import read_calibration_cache as read
        args = (root / "x.calib",)
    elif case == "label":
        _special(root / "labels" / "val" / "bus.txt", kind)
        from enginekit.datasets import load_dataset
        from enginekit.families.ultralytics.labels import read_split

        def read(path):
            return read_split(load_dataset(path), "val", "detect", {0: "a"})
        args = (root / "data.yaml",)
    elif case == "engine-manifest":
        (root / "engine.plan").write_bytes(b"plan")
        _special(root / "manifest.json", kind)
        from enginekit.runtime.loader import resolve_target as read
        args = (str(root / "engine.plan"),)
    else:
        _special(root / "r.yaml", kind)
        from enginekit.recipes import load_recipe as read
        args = (root / "r.yaml",)
    from enginekit.errors import UsageError
    from test_errors_properties import bounded

    with bounded(60), pytest.raises(UsageError, match="not a regular file"):
        read(*args)


def test_verify_data_on_a_fifo_is_one_line(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    line = assert_refused(invoke(["verify", "yolo12n", "--random-init", "--data", str(tmp_path / "fifo.yaml")]))
    assert "FIFO" in line and "not a regular file" in line


def test_open_regular_opens_regular_files_and_nothing_else(tmp_path):
    from enginekit.fsutil import NotRegular, open_regular, read_text

    (tmp_path / "a.txt").write_text("text")
    assert read_text(tmp_path / "a.txt") == "text"
    with pytest.raises(NotRegular, match="4 bytes, more than the 3"):
        read_text(tmp_path / "a.txt", limit=3)
    os.mkfifo(tmp_path / "f")
    with pytest.raises(NotRegular, match="FIFO"):
        open_regular(tmp_path / "f")
    with pytest.raises(IsADirectoryError):
        open_regular(tmp_path)
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")


# --------------------------------------------------------------------------- 3. user code cannot end enginekit

USER_CODE = {
    "exit": ("import sys\nimport torch\n\ndef make():\n    sys.exit(0)\n", "ended the program (sys.exit(0))"),
    "exit-at-import": ("import sys\nsys.exit(3)\n\ndef make():\n    pass\n", "ended the program (sys.exit(3))"),
    "argparse": (textwrap.dedent('''
        import argparse
        import torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--data", required=True)
        args = parser.parse_args()

        def make():
            return torch.nn.Conv2d(3, 4, 3)
        '''), "the following arguments are required: --data"),
    "raises-at-import": ("raise RuntimeError('broken at import')\n", "importing"),
    "factory-raises": ("def make():\n    raise KeyError('no such layer')\n", "building"),
    "forward-raises": (textwrap.dedent('''
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.c = torch.nn.Conv2d(3, 4, 3)

            def forward(self, x):
                raise ValueError("my forward is broken")

        def make():
            return Net()
        '''), "forward failed with ValueError: my forward is broken"),
    "keyboard-exit": ("def make():\n    raise SystemExit('bye')\n", "sys.exit('bye')"),
}


@PROPERTY
@given(case=st.sampled_from(sorted(USER_CODE)), verb=st.sampled_from(["export", "build"]))
def test_user_code_that_exits_or_raises_is_one_line(tmp_path_factory, case, verb):
    """``sys.exit(0)`` in a factory gave exit 0 and nothing written; argparse at import gave argparse's lines and
    exit 2 with no ``error:`` line; a forward that raised gave a traceback."""
    root = tmp_path_factory.mktemp("user-code")
    code, needle = USER_CODE[case]
    (root / "net.py").write_text(code)
    out = root / ("net.onnx" if verb == "export" else "net.plan")
    args = [verb, f"{root / 'net.py'}:make", "--random-init", "--task", "raw", "--size", "32x32", "-o", str(out)]
    if verb == "build":
        args += ["--profile", "1x3x32x32"]
    before = sys.argv[:]
    run = invoke(args, env={"ENGINEKIT_CACHE": str(root / "cache")})
    assert sys.argv == before  # the user's code saw its own argv, and enginekit's came back
    line = assert_refused(run)
    assert needle in line, line
    assert not out.exists()


def test_a_module_factory_that_exits_is_one_line():
    line = assert_refused(invoke(["export", "sys:exit", "--random-init", "--task", "raw", "--size", "32x32"]))
    assert "sys:exit ended the program" in line


def test_user_code_prints_go_to_stderr_and_the_file_is_imported_once(tmp_path, run_cli):
    """``build file.py:make`` printed the user's lines on stdout before the engine path (twice: imported twice)."""
    (tmp_path / "net.py").write_text(textwrap.dedent('''
        import argparse
        import torch
        print("imported")
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=3)  # a train.py's options with defaults: parsed at import
        args = parser.parse_args()

        def make():
            print("factory called")
            return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        '''))
    result = run_cli("build", "net.py:make", "--random-init", "--task", "classify", "--size", "32x32",
                     "--profile", "1x3x32x32", "--no-verify", "-o", "net.plan")
    assert result.code == 0, result.stderr
    assert result.stdout.strip().splitlines() == ["net.plan"]  # the result only
    assert result.stderr.count("imported") == 1 and result.stderr.count("factory called") == 1


# --------------------------------------------------------------------------- 4. torch.export programs


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> Path:
    import zipfile

    import torch

    root = tmp_path_factory.mktemp("programs")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()
    torch.export.save(torch.export.export(net, (torch.zeros(1, 3, 32, 32),)), root / "static.pt2")
    src = zipfile.ZipFile(root / "static.pt2")
    with zipfile.ZipFile(root / "corrupt.pt2", "w") as z:  # a weight cut short: torch logs a traceback, then raises
        for name in src.namelist():
            data = src.read(name)
            z.writestr(name, data[: len(data) // 2] if name.endswith("weight_0") else data)
    return root


@pytest.mark.parametrize("program, needle", [
    ("static.pt2", "captured with a fixed input 1x3x32x32"),
    ("corrupt.pt2", "cannot load corrupt.pt2: setStorage"),
])
def test_a_static_or_corrupt_program_is_one_line(programs, program, needle):
    """A batch-1 program failed with a traceback ("Guard failed: input.size()[0] == 1"); a corrupt one printed
    torch's own traceback (through its logger) before enginekit's line."""
    line = assert_refused(invoke(["export", str(programs / program), "--trust-checkpoint", "--task", "classify",
                                  "--size", "32x32", "-o", str(programs / "out.onnx")]))
    assert needle in line, line
    if program == "static.pt2":
        assert "dynamic_shapes" in line
    assert not (programs / "out.onnx").exists()


# --------------------------------------------------------------------------- 5. the store's paths


@PROPERTY
@given(url=st.sampled_from(["file://", "file://rel/dir", "file://./here", "/", "file:///", "//", "file:////"]))
def test_a_folder_store_url_is_absolute_and_not_the_root(tmp_path_factory, url):
    """``file://`` and ``file://rel/dir`` resolved against the working directory (a push wrote 311 MB there);
    ``/`` (an unset ``$VAR/``) was taken as the team store."""
    cwd = tmp_path_factory.mktemp("cwd")
    before = os.getcwd()
    os.chdir(cwd)
    try:
        for args in (["cache", "push", "--all", "--remote", url], ["cache", "ls", "--remote", url]):
            line = assert_refused(invoke(args, env={"ENGINEKIT_CACHE": str(cwd / "cache")}))
            assert "ABSOLUTE" in line or "filesystem root" in line, line
        line = assert_refused(invoke(["cache", "ls", "--remote"], env={"ENGINEKIT_REMOTE": url,
                                                                       "ENGINEKIT_CACHE": str(cwd / "cache")}))
        assert "ENGINEKIT_REMOTE" in line
    finally:
        os.chdir(before)
    assert not [p for p in cwd.rglob("*") if p.name != "cache"], list(cwd.rglob("*"))


@pytest.fixture
def local_entry(tmp_path):
    """A cache with one export entry and one engine entry (its manifest as the build flow writes it)."""
    from enginekit.cache import Cache
    from test_store import engine_producer

    cache = Cache(tmp_path / "cache", remote=None)
    export, _ = cache.get_or_create("onnx-export", {"stage": "store-paths"},
                                    lambda tmp: (tmp / "model.onnx").write_bytes(b"graph") and {})
    engine, _ = cache.get_or_create("engine", {"e": "store-paths"}, engine_producer(b"plan"), subject="tiny")
    return cache, export, engine


@pytest.mark.parametrize("where", ["missing", "file", "inside-cache", "the-cache"])
def test_push_goes_only_to_a_store_folder_that_exists_apart_from_the_cache(tmp_path, local_entry, where):
    """A push to a missing folder made it and succeeded while ``ls --remote`` said "create it first"; a store that
    is a file gave a traceback; a store inside the cache was accepted (``cache purge`` then deleted it)."""
    cache, export, _ = local_entry
    target = {"missing": tmp_path / "typo" / "store", "file": tmp_path / "a-file",
              "inside-cache": cache.root / "store", "the-cache": cache.root}[where]
    if where == "file":
        target.write_text("not a store\n")
    env = {"ENGINEKIT_CACHE": str(cache.root)}
    pushed = invoke(["cache", "push", export.key[:12], "--remote", f"file://{target}"], env=env)
    listed = invoke(["cache", "ls", "--remote", f"file://{target}"], env=env)
    code = 2 if where in ("inside-cache", "the-cache") else 3
    for run in (pushed, listed):
        line = assert_refused(run, (code,))
        assert ("create it first" in line) if code == 3 else ("inside the local cache" in line), line
    assert not (tmp_path / "typo").exists()
    assert {p.name for p in cache.root.iterdir() if not p.name.startswith(".")} == {"onnx-export", "engine"}


def test_a_garbage_index_record_is_written_anew_by_the_next_push(tmp_path, local_entry):
    """One garbage record made every push of that engine crash (JSONDecodeError traceback)."""
    from enginekit.store.identity import identity_of
    from enginekit.store.tier import index_name

    cache, _, engine = local_entry
    (tmp_path / "store").mkdir()
    name = index_name(identity_of(engine.manifest), engine.key)
    (tmp_path / "store" / name).parent.mkdir(parents=True)
    (tmp_path / "store" / name).write_bytes(b"\x00{garbage")
    run = invoke(["cache", "push", engine.key[:12], "--remote", f"file://{tmp_path / 'store'}"],
                 env={"ENGINEKIT_CACHE": str(cache.root)})
    assert run.code == 0 and run.exception is None, repr(run)
    record = json.loads((tmp_path / "store" / name).read_text())
    assert record["key"] == engine.key and record["identity"] == identity_of(engine.manifest)


# --------------------------------------------------------------------------- 6. flags that do nothing


@pytest.fixture(scope="module")
def flag_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("flags")
    (root / "net.py").write_text("import torch\n\ndef make():\n    return torch.nn.Conv2d(3, 4, 3)\n")
    (root / "images").mkdir()
    (root / "nc.yaml").write_text(f"path: {root}\nval: images\nnc: -5\n")
    (root / "nc-names.yaml").write_text(f"path: {root}\nval: images\nnc: 3\nnames: [a, b]\n")
    (root / "gap.yaml").write_text(f"path: {root}\nval: images\nnames: {{0: a, 2: c}}\n")
    (root / "split.yaml").write_text("model:\n  variant: yolo12n\n  random_init: true\nverification:\n"
                                     "  data_split: test\n")
    return root


FLAGS = {
    "ls --store, no --remote": (["cache", "ls", "--store", "file:///srv/x"], "--store file:///srv/x: a store URL goes"),
    "gc --store, no --remote": (["cache", "gc", "--store", "file:///srv/x", "--max-age", "1d"], "goes with --remote"),
    "ls URL, no --remote": (["cache", "ls", "file:///srv/x"], "file:///srv/x: a store URL goes with --remote"),
    "ls --remote --verify": (["cache", "ls", "--remote", "--verify"], "--verify"),
    "verify --data-limit, no --data": (["verify", "yolo12n", "--random-init", "--data-limit", "3"], "--data-limit"),
    "verify --data-split, no --data": (["verify", "yolo12n", "--random-init", "--data-split", "test"], "--data-split"),
    "recipe data_split, no data": (["recipes", "show", "{root}/split.yaml"], "data_split"),
    "--classes on a file factory": (["export", "{root}/net.py:make", "--random-init", "--classes", "3", "--task",
                                     "classify", "--size", "32x32"], "--classes 3"),
    "nc: -5": (["verify", "yolo12n", "--random-init", "--data", "{root}/nc.yaml"], "nc -5"),
    "nc against names": (["verify", "yolo12n", "--random-init", "--data", "{root}/nc-names.yaml"], "nc 3 but 2 names"),
    "names with a gap": (["verify", "yolo12n", "--random-init", "--data", "{root}/gap.yaml"], "0 to 1"),
}


@PROPERTY
@given(case=st.sampled_from(sorted(FLAGS)))
def test_a_flag_that_would_do_nothing_is_refused(flag_world, case):
    args, needle = FLAGS[case]
    env = {"ENGINEKIT_REMOTE": f"file://{flag_world}", "ENGINEKIT_CACHE": str(flag_world / "cache")}
    line = assert_refused(invoke([a.format(root=flag_world) for a in args], env=env))
    assert needle in line, line


# --------------------------------------------------------------------------- 7. capability before work


@pytest.mark.parametrize("extra", [["--backend", "tensorrt"], ["--backend", "onnxruntime-cuda"], ["--device", "cuda:0"],
                                   ["--backend", "torch", "--device", "cuda"]])
def test_tune_refuses_what_cannot_run_here_before_any_build(tmp_path, extra, monkeypatch):
    """It built engines for ~45 s, then exited 1 ("none could be timed")."""
    from enginekit.gpu import gpu_info

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    gpu_info.cache_clear()
    try:
        run = invoke(["tune", "yolov8n", "--random-init", "--p99", "25ms", "--input", "160", *extra],
                     env={"ENGINEKIT_CACHE": str(tmp_path / "cache")})
    finally:
        gpu_info.cache_clear()
    line = assert_refused(run, (3,))
    assert "GPU" in line, line
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("*/*"))


def test_tune_refuses_a_fifo_as_its_recipe_before_the_search(tmp_path):
    os.mkfifo(tmp_path / "tuned.yaml")
    line = assert_refused(invoke(["tune", "yolov8n", "--random-init", "--p99", "25ms", "--backend", "onnxruntime-cpu",
                                  "--write-recipe", str(tmp_path / "tuned.yaml")],
                                 env={"ENGINEKIT_CACHE": str(tmp_path / "cache")}))
    assert "FIFO" in line
    assert (tmp_path / "tuned.yaml").is_fifo()


# --------------------------------------------------------------------------- 8. a calibration cache's folder


def test_a_calibration_cache_in_a_missing_folder_is_refused(tmp_path):
    """``--calib-cache /nonexistent/dir/x.calib`` made the folders."""
    from test_errors_properties import _tiny_onnx

    _tiny_onnx(tmp_path / "tiny.onnx")
    line = assert_refused(invoke(["build", str(tmp_path / "tiny.onnx"), "--precision", "int8", "--calib-cache",
                                  str(tmp_path / "no" / "dir" / "x.calib")]))
    assert "does not exist" in line
    assert not (tmp_path / "no").exists()
