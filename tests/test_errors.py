"""Bad input gets one line, checkpoints run no code unless trusted, and the cache cleans up.

Checkpoints: Ultralytics ``.pt`` files are pickles. They are read through PyTorch's
``weights_only`` unpickler and an allowlist; a crafted pickle's payload must not run.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_one_line_error
from enginekit.errors import UsageError

# --------------------------------------------------------------------------- crafted pickles


class _System:
    """Unpickling runs ``os.system(command)``."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Touch:
    """Unpickling runs ``open(path, "w")``: creates the file."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _evil(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A checkpoint whose payload creates ``marker``; (checkpoint, marker)."""
    import torch

    marker = tmp_path / f"payload-ran-{how}"
    path = tmp_path / f"evil-{how}.pt"
    if how == "system":
        torch.save({"model": _System(f"touch {marker}")}, path)
    elif how == "open":
        torch.save({"model": _Touch(marker), "train_args": {}}, path)
    elif how == "raw-pickle":  # not a torch zip archive: the legacy reader's unpickler
        with open(path, "wb") as f:
            pickle.dump({"model": _System(f"touch {marker}")}, f, protocol=2)
    elif how == "nested":  # the payload hides inside an allowed container
        from collections import OrderedDict

        torch.save({"model": None, "ema": OrderedDict(a=[1, {"b": _Touch(marker)}])}, path)
    else:
        raise ValueError(how)
    return path, marker


@pytest.mark.parametrize("how", ["system", "open", "raw-pickle", "nested"])
def test_crafted_pickle_payload_does_not_run(tmp_path, how):
    from enginekit.families import resolve

    path, marker = _evil(tmp_path, how)
    with pytest.raises(UsageError) as info:
        resolve("yolo12n").load(path, random_init=False, seed=0)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert not marker.exists(), "the checkpoint's payload ran"
    if how != "raw-pickle":
        # refused before unpickling: names what it refused and how to opt in
        assert "--trust-checkpoint" in message and "ENGINEKIT_TRUST_CHECKPOINTS" in message
        assert ("system" in message) or ("open" in message)


def test_cli_refuses_crafted_pickle_with_one_line(run_cli, tmp_path):
    path, marker = _evil(tmp_path, "open")
    cache_root = Path(os.environ["ENGINEKIT_CACHE"])
    before = _entries(cache_root)
    result = run_cli("export", "yolo12n", "-w", str(path), "-o", str(tmp_path / "out.onnx"))
    line = assert_one_line_error(result, 2, str(path), "--trust-checkpoint")
    assert "io.open" in line or "builtins.open" in line
    assert not marker.exists()
    assert not (tmp_path / "out.onnx").exists()
    assert _entries(cache_root) == before


def test_trusting_a_checkpoint_is_an_explicit_choice(tmp_path, monkeypatch):
    """With the opt-in, the file is unpickled as Ultralytics does (so its code runs): this is
    what the setting means, and why it is off by default."""
    from enginekit.families.checkpoints import load_ultralytics_model, trust_requested, trusting

    path, marker = _evil(tmp_path, "open")
    monkeypatch.delenv("ENGINEKIT_TRUST_CHECKPOINTS", raising=False)
    assert not trust_requested()
    with trusting():
        assert trust_requested()
    monkeypatch.setenv("ENGINEKIT_TRUST_CHECKPOINTS", "1")
    assert trust_requested() and not trust_requested(False)
    with pytest.raises(Exception):  # noqa: B017 - the payload ran; the result is no model
        load_ultralytics_model(path)
    assert marker.exists()


def test_allowlist_is_model_classes_not_callables():
    from enginekit.families.checkpoints import allowed_globals

    allowed = allowed_globals()
    for needed in (
        "ultralytics.nn.tasks.DetectionModel",
        "ultralytics.nn.modules.head.Detect",
        "ultralytics.nn.modules.conv.Conv",
        "torch.nn.modules.conv.Conv2d",
        "torch.nn.modules.batchnorm.BatchNorm2d",
        "ultralytics.utils.IterableSimpleNamespace",
    ):
        assert needed in allowed
    for dangerous in ("posix.system", "os.system", "builtins.eval", "builtins.exec", "builtins.open",
                      "io.open", "subprocess.Popen", "builtins.__import__", "torch.load"):
        assert dangerous not in allowed


def test_restricted_getattr_serves_methods_of_allowed_modules_only():
    import torch

    from enginekit.families.checkpoints import _safe_getattr

    conv = torch.nn.Conv2d(1, 1, 1)
    assert _safe_getattr(conv, "forward") == conv.forward
    for obj, name in ((conv, "__init__"), (conv, "_apply"), (conv, "weight"), (object(), "forward"),
                      (os, "system")):
        with pytest.raises(RuntimeError):
            _safe_getattr(obj, name)


# --------------------------------------------------------------------------- real checkpoints


@pytest.fixture(scope="module")
def yolo_random():
    from enginekit.families import resolve

    adapter = resolve("yolo12n")
    return adapter, adapter.load(None, random_init=True, seed=7)


def _outputs(module, x):
    import torch

    with torch.no_grad():
        out = module(x)
    return (out[0] if isinstance(out, (list, tuple)) else out).float().numpy()


def _trainer_format(path: Path) -> None:
    """A checkpoint with the fields ``BaseTrainer.save_model`` writes mid-training: an FP16 EMA
    whose ``args`` is an IterableSimpleNamespace, optimizer state, numpy floats, metrics."""
    import copy

    import torch
    from ultralytics import YOLO
    from ultralytics.cfg import get_cfg

    from enginekit.families.base import seed_everything

    seed_everything(11)
    model = YOLO("yolo12n.yaml", task="detect").model
    model.args = get_cfg()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sum((p**2).sum() for p in model.parameters()).backward()  # gives SGD momentum buffers
    optimizer.step()
    torch.save(
        {
            "epoch": 0,
            "best_fitness": np.float64(0.25),
            "stopper": {"best_fitness": np.float64(0.25), "best_epoch": 0},
            "model": None,
            "ema": copy.deepcopy(model).eval().half(),
            "updates": 4,
            "modelopt": None,
            "optimizer": optimizer.state_dict(),
            "scaler": {},
            "train_args": vars(get_cfg()),
            "train_metrics": {"metrics/mAP50(B)": np.float64(0.1), "fitness": np.float64(0.25)},
            "train_results": {"epoch": [1.0], "train/box_loss": [1.5]},
            "date": "2026-01-01T00:00:00+00:00",
            "version": "8.4.0",
            "git": {"root": None, "branch": None, "commit": None, "message": None, "origin": None},
            "license": "AGPL-3.0 (https://ultralytics.com/license)",
            "docs": "https://docs.ultralytics.com",
        },
        path,
    )


def test_enginekit_checkpoint_loads_without_opting_in(tmp_path, yolo_random, monkeypatch):
    """The format ``save_checkpoint`` writes (tests use it): a prepared model whose forward is
    one of its own methods, pickled through getattr."""
    import torch

    monkeypatch.delenv("ENGINEKIT_TRUST_CHECKPOINTS", raising=False)
    adapter, loaded = yolo_random
    ckpt = tmp_path / "ek.pt"
    adapter.save_checkpoint(loaded, ckpt)
    again = adapter.load(ckpt, random_init=False, seed=0)
    assert again.weights.kind == "file"
    x = torch.rand(2, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(_outputs(again.module, x), _outputs(loaded.module, x))


@pytest.mark.parametrize("fmt", ["model.save", "trainer"])
def test_ultralytics_checkpoint_loads_without_opting_in(tmp_path, fmt, monkeypatch):
    """Checkpoints as Ultralytics writes them load through the restricted unpickler, in a fresh
    process (nothing registered by an earlier load)."""
    monkeypatch.delenv("ENGINEKIT_TRUST_CHECKPOINTS", raising=False)
    ckpt = tmp_path / f"{fmt}.pt"
    if fmt == "model.save":
        from ultralytics import YOLO

        YOLO("yolo12n.yaml").save(ckpt)
    else:
        _trainer_format(ckpt)
    script = (
        "import sys, torch; from pathlib import Path\n"
        "from enginekit.families.checkpoints import load_ultralytics_model\n"
        "m = load_ultralytics_model(Path(sys.argv[1]))\n"
        "assert m.task == 'detect' and not m.training\n"
        "print(type(m).__name__, next(m.parameters()).dtype)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(ckpt)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["DetectionModel", "torch.float32"]


def test_trained_checkpoint_loads_without_opting_in(trained_detector, monkeypatch, tmp_path):
    """The detector the suite trains with Ultralytics' trainer (its best.pt), through the
    restricted unpickler in a fresh process, and the same weights as Ultralytics' own loader."""
    import torch

    monkeypatch.delenv("ENGINEKIT_TRUST_CHECKPOINTS", raising=False)
    script = (
        "import sys, torch; from pathlib import Path\n"
        "from enginekit.families.checkpoints import load_ultralytics_model\n"
        "m = load_ultralytics_model(Path(sys.argv[1]))\n"
        "torch.save(m.state_dict(), sys.argv[2])\n"
        "print(m.task, len(m.names))\n"
    )
    out = tmp_path / "state.pt"
    proc = subprocess.run([sys.executable, "-c", script, str(trained_detector.weights), str(out)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["detect", str(len(trained_detector.names))]
    from ultralytics.nn.tasks import load_checkpoint

    reference = load_checkpoint(str(trained_detector.weights))[0].state_dict()
    state = torch.load(out, weights_only=True)
    assert state.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0)


def test_state_dict_given_to_yolo_is_one_line(tmp_path):
    """A Depth-Anything ``.pth`` (a state dict) given to a YOLO."""
    import torch

    from enginekit.families import resolve

    path = tmp_path / "depth_anything_v2_vits.pth"
    torch.save({"pretrained.blocks.0.attn.qkv.weight": torch.zeros(3, 3),
                "depth_head.scratch.output_conv2.2.bias": torch.zeros(1)}, path)
    with pytest.raises(UsageError, match="state dict") as info:
        resolve("yolo12n").load(path, random_init=False, seed=0)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("content", [b"root:x:0:0:root:/root:/bin/bash\n", b"", b"PK\x03\x04garbage",
                                     b"\x80\x02}q\x00."])
def test_files_that_are_no_checkpoint_are_one_line(tmp_path, content):
    from enginekit.families import resolve

    path = tmp_path / "weights.pt"
    path.write_bytes(content)
    with pytest.raises(UsageError) as info:
        resolve("yolo12n").load(path, random_init=False, seed=0)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "text, needle",
    [
        ("99999999999999999999x3x320x320", "int32"),
        ("1x3x2147483648x1", "int32"),
        ("100000x3x320x320", "GiB"),
        ("1x3x100000x100000", "GiB"),
        ("1" * 5000 + "x3x320x320", "int32"),  # more digits than int() reads
        ("1x3x320x320x1x1x1x1x1", "at most 8"),
        ("\u0661x3x320x320", "malformed"),  # a non-ASCII digit
        ("0x3x320x320", "positive"),
    ],
)
def test_shapes_no_machine_can_hold_are_refused_naming_the_value(text, needle):
    from enginekit.shapes import parse_shape

    with pytest.raises(UsageError) as info:
        parse_shape(text, what="--input")
    message = str(info.value)
    assert needle in message and "--input" in message and "\n" not in message
    assert len(message) < 400


def test_profiles_no_machine_can_hold_are_refused():
    from enginekit.shapes import parse_profile

    with pytest.raises(UsageError, match="int32"):
        parse_profile("99999999999999999999x3x640x640:1x3x640x640:1x3x640x640")
    with pytest.raises(UsageError, match="GiB"):
        parse_profile("1x3x640x640:2x3x640x640:100000x3x640x640")
    assert parse_profile("1x3x640x640:8x3x640x640:16x3x640x640").inputs[None].max == (16, 3, 640, 640)


def test_memory_limit_follows_setting_and_batch_check(monkeypatch):
    from enginekit.shapes import check_batch, parse_shape

    monkeypatch.setenv("ENGINEKIT_MAX_TENSOR_BYTES", str(10 * 2**20))
    assert parse_shape("1x3x640x640") == (1, 3, 640, 640)  # 4.7 MiB
    assert parse_shape("2x3x640x640") == (2, 3, 640, 640)  # 9.4 MiB
    with pytest.raises(UsageError, match="MiB"):
        parse_shape("3x3x640x640")  # 14.1 MiB
    with pytest.raises(UsageError, match="--batch"):
        check_batch(100000, (3, 640, 640))
    for bad in (0, -1, True, 2**40):
        with pytest.raises(UsageError, match="--batch"):
            check_batch(bad, (3, 640, 640))
    monkeypatch.setenv("ENGINEKIT_MAX_TENSOR_BYTES", "lots")
    with pytest.raises(UsageError, match="ENGINEKIT_MAX_TENSOR_BYTES"):
        parse_shape("1x3x640x640")


@pytest.mark.parametrize("text", ["99999999999999999999x3x320x320", "100000x3x320x320", "1x3x100000x100000"])
def test_cli_export_input_too_large_is_one_line(run_cli, tmp_path, text):
    result = run_cli("export", "yolo12n", "--random-init", "--input", text, "-o", str(tmp_path / "x.onnx"))
    assert_one_line_error(result, 2, text)
    assert not (tmp_path / "x.onnx").exists()


# --------------------------------------------------------------------------- cache location and gc


def _entries(root: Path) -> set[str]:
    if not root.is_dir():
        return set()
    return {f"{k.name}/{e.name}" for k in root.iterdir() if k.is_dir() and not k.name.startswith(".")
            for e in k.iterdir()}


@pytest.fixture
def bad_cache_roots(tmp_path):
    regular = tmp_path / "a-file"
    regular.write_text("not a cache\n")
    return {"regular file": regular, "under a file": regular / "cache", "proc": Path("/proc/enginekit-x"),
            "sys": Path("/sys/enginekit-x"), "proc itself": Path("/proc")}


def test_cache_location_problems_are_one_line(bad_cache_roots):
    from enginekit.cache import Cache

    for label, root in bad_cache_roots.items():
        cache = Cache(root)
        assert cache.location_problem() is not None, label
        for call in (cache.ls, cache.gc, cache.purge, lambda: cache.lookup("engine", "0" * 64),
                     lambda: cache.get_or_create("engine", {"a": 1}, lambda d: None)):
            with pytest.raises(UsageError) as info:
                call()
            assert str(root) in str(info.value) and "\n" not in str(info.value), label
    assert bad_cache_roots["regular file"].read_text() == "not a cache\n"


def test_cache_location_is_checked_once_and_good_roots_pass(tmp_path, monkeypatch):
    from enginekit.cache import local as cache_mod
    from enginekit.cache import Cache

    calls = []
    real = cache_mod.location_problem
    monkeypatch.setattr(cache_mod, "location_problem", lambda *a, **k: calls.append(1) or real(*a, **k))
    cache = Cache(tmp_path / "new" / "cache")
    assert cache.ls() == []
    for _ in range(3):
        cache.get_or_create("engine", {"a": 1}, lambda d: (d / "x").write_text("x") and None)
    assert len(calls) <= 2  # once for reading, once for writing


@pytest.mark.parametrize("verb", ["ls", "gc", "purge"])
def test_cli_cache_verbs_refuse_a_regular_file(run_cli, tmp_path, verb):
    regular = tmp_path / "cachefile"
    regular.write_text("x")
    result = run_cli("cache", verb, env={"ENGINEKIT_CACHE": str(regular)})
    assert_one_line_error(result, 2, "ENGINEKIT_CACHE", str(regular))
    assert regular.read_text() == "x"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_gc_removes_staging_folders_of_dead_builds_at_once(tmp_path):
    from enginekit.cache import Cache
    from enginekit.hashing import key_for

    cache = Cache(tmp_path / "cache")
    key = key_for({"a": 1})
    dead = cache.root / ".tmp" / f"engine-{key}-{_dead_pid()}-0badc0de"
    dead.mkdir(parents=True)
    (dead / "engine.plan").write_bytes(b"half")
    live = cache.root / ".tmp" / f"engine-{key_for({'b': 2})}-{os.getppid()}-0badc0de"  # a live pid
    live.mkdir()
    assert cache.gc() == []
    assert not dead.exists()
    assert live.exists()  # its builder may still be working
    assert cache.gc(stale_tmp_seconds=0) == [] and not live.exists()  # old enough and its lock is free


def test_rerun_clears_its_keys_dead_staging_folders(tmp_path):
    from enginekit.cache import Cache
    from enginekit.hashing import key_for

    cache = Cache(tmp_path / "cache")
    parts = {"a": 1}
    dead = cache.root / ".tmp" / f"engine-{key_for(parts)}-{_dead_pid()}-0badc0de"
    dead.mkdir(parents=True)
    entry, status = cache.get_or_create("engine", parts, lambda d: (d / "x").write_text("x") and None)
    assert status == "miss" and entry.path.is_dir()
    assert not dead.exists()


def test_gc_removes_free_empty_lock_files_and_keeps_held_ones(tmp_path):
    from filelock import FileLock

    from enginekit.cache import Cache
    from enginekit.hashing import key_for

    cache = Cache(tmp_path / "cache")
    for i in range(5):  # failed runs leave lock files behind
        with pytest.raises(RuntimeError):
            cache.get_or_create("engine", {"i": i}, lambda d: (_ for _ in ()).throw(RuntimeError("boom")))
    locks = cache.root / ".locks"
    assert len(list(locks.glob("*.lock"))) == 5
    held = locks / f"engine-{key_for({'held': 1})}.lock"
    holder = FileLock(held)
    holder.acquire()
    try:
        target = tmp_path / "not-a-lock"
        target.write_text("keep")
        (locks / "engine-link.lock").symlink_to(target)  # never followed
        cache.gc()
        left = sorted(p.name for p in locks.iterdir())
        assert left == sorted([held.name, "engine-link.lock"])
        assert target.read_text() == "keep"
    finally:
        holder.release()
    # the lock is still usable after gc removed others
    cache.get_or_create("engine", {"i": 0}, lambda d: (d / "x").write_text("x") and None)


def test_purge_removes_lock_files_too(tmp_path):
    from enginekit.cache import Cache

    cache = Cache(tmp_path / "cache")
    cache.get_or_create("engine", {"a": 1}, lambda d: (d / "x").write_text("x") and None)
    assert list((cache.root / ".locks").iterdir())
    cache.purge()
    assert not list((cache.root / ".locks").iterdir())
    assert _entries(cache.root) == set()


# --------------------------------------------------------------------------- properties of the pieces

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_FAST = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                 suppress_health_check=list(HealthCheck))


@_FAST
@given(st.text(max_size=60))
def test_any_shape_text_parses_or_is_one_line(text):
    from enginekit.shapes import INT32_MAX, parse_shape

    try:
        dims = parse_shape(text, what="--input")
    except UsageError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400 and "--input" in str(exc)
    else:
        assert dims and all(1 <= d <= INT32_MAX for d in dims)


_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=25, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=_plain, where=st.integers(min_value=0, max_value=3))
def test_a_payload_anywhere_in_a_checkpoint_never_runs(tmp_path_factory, data, where):
    import torch

    from enginekit.families.checkpoints import safe_load

    folder = tmp_path_factory.mktemp("payload")
    marker = folder / "ran"
    payload = _Touch(marker)
    wrapped = [payload, {"x": payload}, {"model": None, "ema": [data, payload]}, (data, {"deep": [[payload]]})][where]
    path = folder / "ckpt.pt"
    torch.save({"train_args": data, "model": wrapped}, path)
    with pytest.raises(UsageError, match="trust-checkpoint"):
        safe_load(path)
    assert not marker.exists()


@_FAST
@given(st.sampled_from(["/proc", "/sys", "/dev"]), st.lists(st.text("abcxyz_-", min_size=1, max_size=6), max_size=3))
def test_cache_roots_under_kernel_filesystems_are_refused(base, parts):
    from enginekit.cache import location_problem

    root = "/".join([base, *parts])
    assert location_problem(root) is not None
# --------------------------------------------------------------------------- one error path


@pytest.mark.parametrize(
    "path, folder, needle",
    [
        ("/proc/x.onnx", False, "/proc"),
        ("/sys/x.json", False, "/sys"),
        ("/dev/null", False, "/dev"),
        ("{dir}", False, "is a folder"),
        ("{regular}/x.onnx", False, "not a folder"),
        ("{regular}", True, "not a folder"),
        ("{dir}/", False, "folder"),
    ],
)
def test_output_paths_that_cannot_be_written_are_refused_before_work(tmp_path, path, folder, needle):
    from enginekit.fsutil import check_output_path, output_path_problem

    regular = tmp_path / "regular.txt"
    regular.write_text("x")
    (tmp_path / "d").mkdir()
    path = path.format(dir=tmp_path / "d", regular=regular)
    assert needle in (output_path_problem(path, folder=folder) or "")
    with pytest.raises(UsageError) as info:
        check_output_path(path, "--report", folder=folder)
    assert str(info.value).startswith(f"--report {path}") and "\n" not in str(info.value)
    assert regular.read_text() == "x" and not list((tmp_path / "d").iterdir())  # nothing created


def test_output_paths_that_can_be_written_pass(tmp_path):
    from enginekit.fsutil import output_path_problem

    assert output_path_problem(tmp_path / "new" / "deeper" / "x.onnx") is None
    assert output_path_problem(tmp_path / "report-folder", folder=True) is None
    assert not (tmp_path / "new").exists()


def test_error_line_is_printed_verbatim_on_one_line(capsys):
    from enginekit.cli.common import error_text, print_error

    print_error("malformed profile 'a:b:c:d' [bold]x[/] :smile:\nsecond line\x1b[31m")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "'a:b:c:d' [bold]x[/] :smile: second line\\x1b[31m" in lines[0]
    assert lines[0].startswith("error: ")
    assert error_text("a\tb") == "a\\tb"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["export", "yolo12n", "--bogus"], "--bogus"),
        (["build", "x.onnx", "--opt-level", "abc"], "--opt-level"),
        (["models", "extra"], "extra"),
        (["cache", "gc", "--max-size"], "--max-size"),
        (["nosuchverb"], "nosuchverb"),
    ],
)
def test_parser_errors_are_one_error_line_exit_2(args, needle):
    from typer.testing import CliRunner

    from enginekit.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], result.stderr


def test_help_and_version_still_work():
    from typer.testing import CliRunner

    from enginekit.cli import app

    for args in (["--help"], ["export", "--help"], ["cache", "--help"], ["--version"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0 and result.stdout.strip() and not result.stderr.strip(), args
    bare = CliRunner().invoke(app, [])
    assert "Usage" in bare.stdout and bare.exit_code == 2


def test_opset_range_matches_the_exporter():
    import torch.onnx._constants as constants

    from enginekit.options import OPSET_MAX, OPSET_MIN
    from enginekit.requests import ExportRequest

    assert (OPSET_MIN, OPSET_MAX) == (constants.ONNX_MIN_OPSET, constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET)
    for bad in (3, 6, 21, 99):
        with pytest.raises(UsageError, match="--opset"):
            ExportRequest(model="yolo12n", random_init=True, opset=bad)


def test_deep_or_huge_recipe_is_one_line(tmp_path):
    from enginekit.recipes import load_recipe

    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 100000)
    nested = tmp_path / "nested.yaml"
    nested.write_text("model: yolo12n\nx: " + "[" * 40 + "]" * 40 + "\n")
    huge = tmp_path / "huge.yaml"
    huge.write_text("model: yolo12n\n" + "#" * (2 << 20) + "\n")
    for path, needle in ((deep, "nested"), (nested, "nested"), (huge, "characters")):
        with pytest.raises(UsageError, match=needle) as info:
            load_recipe(str(path))
        assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_a_missing_library_is_one_line_exit_3(capsys):
    """A step whose library is missing or broken (an install problem) says so in one line, exit 3."""
    import typer

    from enginekit.cli.common import handles_errors

    @handles_errors
    def step():
        raise ModuleNotFoundError("No module named 'onnxruntime.quantization'", name="onnxruntime.quantization")

    with pytest.raises(typer.Exit) as exit_info:
        step()
    assert exit_info.value.exit_code == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot import onnxruntime.quantization"), err
