"""The cache keeps its promises: listing is no use, gc and purge keep what a run uses, SIGTERM cleans
up, an identical INT8 build with --calib-cache is a hit, a full disk is one line, files follow the umask."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error
from enginekit.cache import Cache, holding_entries
from enginekit.cache.inuse import in_use

PARTS = {"stage": "export", "model": "tiny", "n": 1}


def produce(tmp: Path) -> dict:
    (tmp / "model.onnx").write_bytes(b"graph" * 1000)
    return {}


def test_listing_is_no_use_and_reads_sizes_only(tmp_path, run_cli):
    cache = Cache(tmp_path / "c", remote=None)
    entry, _ = cache.get_or_create("onnx-export", PARTS, produce)
    month_ago = time.time() - 31 * 86400
    os.utime(entry.path, (month_ago, month_ago))
    env = {"ENGINEKIT_CACHE": str(tmp_path / "c")}
    listed = run_cli("cache", "ls", "--json", env=env)
    assert listed.code == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["entries"]
    assert row["valid"] and row["verified"] is False
    assert run_cli("cache", "ls", env=env).code == 0
    assert entry.path.stat().st_mtime == pytest.approx(month_ago)  # listing twice used nothing
    gone = run_cli("cache", "gc", "--max-age", "30d", env=env)
    assert gone.code == 0 and "removed 1 entries" in gone.stderr and not entry.path.exists()


USER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from enginekit.cache import Cache, holding_entries

    root, key, ready, release = sys.argv[1:5]
    with holding_entries():
        found = Cache(root, remote=None).lookup("onnx-export", key)
        assert found.entry is not None
        Path(ready).touch()
        while not Path(release).exists():
            time.sleep(0.01)
        print(found.entry.file("model.onnx").read_bytes()[:5].decode())
    """
)


@pytest.mark.parametrize("clean", [["gc", "--max-age", "0s"], ["gc", "--max-size", "1K"], ["purge"]])
def test_gc_and_purge_keep_the_entries_a_run_is_using(tmp_path, run_cli, clean):
    cache = Cache(tmp_path / "c", remote=None)
    used, _ = cache.get_or_create("onnx-export", PARTS, produce)
    unused, _ = cache.get_or_create("onnx-export", {**PARTS, "n": 2}, produce)
    script, ready, release = tmp_path / "user.py", tmp_path / "ready", tmp_path / "release"
    script.write_text(USER)
    user = subprocess.Popen([sys.executable, str(script), str(tmp_path / "c"), used.key, str(ready), str(release)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not ready.exists():
        assert user.poll() is None and time.time() < deadline, user.communicate()
        time.sleep(0.01)
    env = {"ENGINEKIT_CACHE": str(tmp_path / "c")}
    result = run_cli("cache", *clean, env=env)
    assert result.code == 0 and "removed 1 entries" in result.stderr, result.stderr
    assert used.path.exists() and not unused.path.exists()
    release.touch()
    out, err = user.communicate(timeout=60)
    assert user.returncode == 0 and out.strip() == "graph", err  # its files were there all along
    assert run_cli("cache", "purge", env=env).code == 0
    assert not used.path.exists()  # the run ended: nothing keeps it
    assert not (tmp_path / "c" / ".inuse").exists() or not any((tmp_path / "c" / ".inuse").iterdir())


def test_a_run_holds_what_it_uses_until_it_ends(tmp_path):
    """The flows hold their entries (``flows.run``): another process's purge leaves them."""
    from enginekit.flows import run

    cache = Cache(tmp_path / "c", remote=None)

    class Outcome:
        events = []

    def flow(request, cache):
        entry, _ = cache.get_or_create("onnx-export", PARTS, produce)
        subprocess.run([sys.executable, "-m", "enginekit", "cache", "purge"], check=True, capture_output=True,
                       env=dict(os.environ, ENGINEKIT_CACHE=str(cache.root)))
        assert entry.file("model.onnx").is_file()
        return Outcome()

    run(flow, None, cache)
    assert Cache(tmp_path / "c", remote=None).purge() != []


def test_a_marker_of_an_ended_run_keeps_nothing(tmp_path):
    cache = Cache(tmp_path / "c", remote=None)
    with holding_entries():
        entry, _ = cache.get_or_create("onnx-export", PARTS, produce)
        assert in_use(cache.root, "onnx-export", entry.key)
    assert not in_use(cache.root, "onnx-export", entry.key)
    folder = tmp_path / "c" / ".inuse" / f"onnx-export-{entry.key}"
    folder.mkdir(parents=True)
    (folder / "12345-dead").write_text("")  # a killed run's marker: no lock held on it
    assert cache.gc(max_age_seconds=0) == [entry.key] and not folder.exists()


@pytest.mark.slow
def test_sigterm_during_a_build_cleans_up_and_exits_143(tmp_path):
    root = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "enginekit", "build", "yolo12n", "--random-init", "--profile",
                             "1x3x64x64", "--no-verify"], env=dict(os.environ, ENGINEKIT_CACHE=str(root)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not ((root / ".tmp").is_dir() and any((root / ".tmp").iterdir())):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, (proc.returncode, err)
    assert "Traceback" not in err
    assert list((root / ".tmp").iterdir()) == []
    assert not out.strip()  # no engine path: nothing was built


# --------------------------------------------------------------------------- INT8 and --calib-cache


@pytest.fixture(scope="module")
def small_onnx(tmp_path_factory) -> tuple[Path, Path]:
    """Two 32-channel convolutions (ModelOpt quantizes them), and 8 inputs to calibrate on."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((32, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32), "w2")
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 32, 32])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 32, 32, 32])
    nodes = [helper.make_node("Conv", ["images", "w1"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["out"])]
    model = helper.make_model(helper.make_graph(nodes, "small", [x], [y], [w1, w2]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    folder = tmp_path_factory.mktemp("small")
    onnx.save(model, folder / "small.onnx")
    np.save(folder / "calib.npy", rng.random((8, 3, 32, 32)).astype(np.float32))
    return folder / "small.onnx", folder / "calib.npy"


INT8 = ["--profile", "1x3x32x32", "--precision", "int8", "--calib-method", "max"]


@pytest.mark.slow
def test_an_identical_int8_build_with_calib_cache_is_a_hit(tmp_path, run_cli, small_onnx):
    graph, data = small_onnx
    env = {"ENGINEKIT_CACHE": str(tmp_path / "cache")}
    calib = tmp_path / "ranges.calib"
    first = run_cli("build", str(graph), *INT8, "--calib-data", str(data), "--calib-cache", str(calib), env=env)
    assert first.code == 0, first.stderr
    assert calib.is_file() and calib.stat().st_mode & 0o777 == 0o666 & ~current_umask()
    again = run_cli("build", str(graph), *INT8, "--calib-data", str(data), "--calib-cache", str(calib), "--explain",
                    env=env)
    assert again.code == 0, again.stderr
    assert again.stdout == first.stdout  # the same engine
    assert "explain engine: hit" in again.stderr and "built" not in again.stderr
    assert len(list((tmp_path / "cache" / "engine").iterdir())) == 1
    # the user's file is written when the INT8 entry was already cached
    later = tmp_path / "later.calib"
    third = run_cli("build", str(graph), *INT8, "--calib-data", str(data), "--calib-cache", str(later), env=env)
    assert third.code == 0 and third.stdout == first.stdout
    assert later.read_bytes() == calib.read_bytes()


def test_a_calib_cache_that_cannot_be_written_is_refused_up_front(tmp_path, run_cli, small_onnx):
    graph, data = small_onnx
    env = {"ENGINEKIT_CACHE": str(tmp_path / "cache")}
    folder = run_cli("build", str(graph), *INT8, "--calib-data", str(data), "--calib-cache", str(tmp_path), env=env)
    assert_one_line_error(folder, 2, "--calib-cache", "is a folder")
    (tmp_path / "afile").write_text("x")
    under_file = run_cli("build", str(graph), *INT8, "--calib-data", str(data), "--calib-cache",
                         str(tmp_path / "afile" / "x.calib"), env=env)
    assert_one_line_error(under_file, 2, "--calib-cache", "not a folder")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("onnx-*"))


# --------------------------------------------------------------------------- a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (mounting needs root; skipped with the reason elsewhere)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def leftovers(folder: Path) -> list[str]:
    """Files left, but for the empty lock files every run leaves (``cache gc`` removes them)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and ".locks" not in p.relative_to(folder).parts)


def test_a_full_disk_in_the_cache_is_one_line_and_leaves_nothing(small_disk, run_cli, small_onnx):
    graph, _ = small_onnx
    result = run_cli("build", str(graph), "--profile", "1x3x32x32", "--precision", "fp32",
                     env={"ENGINEKIT_CACHE": str(small_disk / "cache")})
    assert_one_line_error(result, 2, "no space left")
    assert leftovers(small_disk / "cache") == []  # no entry, no temporary folder


@pytest.mark.slow
def test_a_full_disk_under_export_and_predict_is_one_line_and_leaves_nothing(small_disk, run_cli, cache):
    env = {"ENGINEKIT_CACHE": str(cache.root)}
    exported = run_cli("export", "yolo12n", "--random-init", "--input", "1x3x64x64", "-o",
                       str(small_disk / "yolo.onnx"), env=env)
    assert_one_line_error(exported, 2, "no space left")
    assert leftovers(small_disk) == []
    image = Path(__import__("ultralytics").__file__).parent / "assets" / "bus.jpg"
    predicted = run_cli("predict", "yolo12n", str(image), "--random-init", "--backend", "onnxruntime-cpu",
                        "--save", str(small_disk / "out"), env=env)
    assert_one_line_error(predicted, 2, "no space left")
    assert leftovers(small_disk) == []


def current_umask() -> int:
    from enginekit.fsutil import current_umask as umask

    return umask()
