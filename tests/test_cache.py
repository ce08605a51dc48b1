"""The cache store: keys, atomic entries, corruption, locks across processes, gc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from enginekit.cache import Cache, default_root
from enginekit.hashing import key_for, sha256_file
from enginekit.units import parse_age, parse_size
from enginekit.errors import UsageError

PARTS = {
    "onnx_sha256": "ab" * 32,
    "precision": {"mode": "fp16", "excluded": []},
    "profiles": [[1, 3, 640, 640], [4, 3, 640, 640], [8, 3, 640, 640]],
    "backend": {"name": "tensorrt", "version": "10.13"},
    "target": {"gpu": "H100", "cc": "9.0"},
}

# Run in child processes: build an entry, hang mid-build, or hold a key's lock.
HELPER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from enginekit.cache import Cache

    mode, root, parts = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    args = sys.argv[4:]

    def wait_for(path):
        deadline = time.time() + 30
        while not Path(path).exists():
            if time.time() > deadline:
                sys.exit("timed out waiting for " + path)
            time.sleep(0.01)

    cache = Cache(root)
    if mode == "build":
        counter, ready, go = args
        def produce(tmp):
            time.sleep(1.0)
            with open(counter, "a") as f:
                f.write("built\\n")
            (tmp / "engine.plan").write_bytes(b"plan" * 1000)
            return {}
        Path(ready).touch()
        wait_for(go)
        entry, status = cache.get_or_create("engine", parts, produce)
        print(json.dumps({"status": status, "path": str(entry.path)}))
    elif mode == "hang":
        (marker,) = args
        def produce(tmp):
            with open(tmp / "engine.plan", "wb") as f:
                f.write(b"partial")
                f.flush()
            Path(marker).touch()
            time.sleep(60)
            return {}
        cache.get_or_create("engine", parts, produce)
    elif mode == "hold":
        key, marker, release = args
        with cache.lock("engine", key):
            Path(marker).touch()
            wait_for(release)
    """
)


@pytest.fixture
def helper(tmp_path: Path) -> Path:
    path = tmp_path / "helper.py"
    path.write_text(HELPER)
    return path


def spawn(helper: Path, mode: str, root: Path, parts: dict, *args: object) -> subprocess.Popen:
    cmd = [sys.executable, str(helper), mode, str(root), json.dumps(parts), *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"helper exited early: {proc.stderr.read()}")
        if time.time() > deadline:
            pytest.fail(f"timed out waiting for {path}")
        time.sleep(0.01)


class Producer:
    """A produce callback that counts its calls."""

    def __init__(self, payload: bytes = b"\x00plan-bytes" * 100) -> None:
        self.payload = payload
        self.calls = 0

    def __call__(self, tmp: Path) -> dict:
        self.calls += 1
        (tmp / "engine.plan").write_bytes(self.payload)
        (tmp / "parity.json").write_text('{"passed": true}')
        return {"io": {"inputs": ["images"], "outputs": ["output0"]}, "build_seconds": 1.5}


def with_changes(**changes: object) -> dict:
    return {**PARTS, **changes}


# --------------------------------------------------------------------------- keys


def test_key_ignores_dict_order_but_not_values():
    reordered = {k: PARTS[k] for k in reversed(list(PARTS))}
    reordered["precision"] = {"excluded": [], "mode": "fp16"}
    assert key_for(reordered) == key_for(PARTS)
    assert len(key_for(PARTS)) == 64
    assert key_for(with_changes(precision={"mode": "int8", "excluded": []})) != key_for(PARTS)
    assert key_for(with_changes(profiles=[[1, 3, 640, 640]])) != key_for(PARTS)


def test_key_refuses_paths():
    with pytest.raises(TypeError):
        key_for({"onnx": Path("/x/model.onnx")})


def test_sha256_file_matches_hashlib(tmp_path: Path):
    import hashlib

    data = os.urandom(3 * (1 << 20) + 17)  # spans several chunks
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_default_root_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("ENGINEKIT_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "explicit"
    monkeypatch.delenv("ENGINEKIT_CACHE")
    assert default_root() == tmp_path / "xdg" / "enginekit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_root() == Path.home() / ".cache" / "enginekit"


# --------------------------------------------------------------------------- get_or_create


def test_miss_then_hit_with_complete_manifest(tmp_path: Path):
    cache = Cache(tmp_path)
    produce = Producer()
    entry, status = cache.get_or_create("engine", PARTS, produce, subject="yolo12n")
    assert (status, produce.calls) == ("miss", 1)
    assert entry.path == tmp_path / "engine" / key_for(PARTS)
    assert entry.file("engine.plan").read_bytes() == produce.payload

    manifest = json.loads(entry.file("manifest.json").read_text())
    assert manifest == entry.manifest
    assert manifest["kind"] == "engine"
    assert manifest["key"] == key_for(PARTS)
    assert manifest["parts"] == PARTS
    assert manifest["subject"] == "yolo12n"
    assert manifest["build_seconds"] == 1.5  # extra fields merged at top level
    assert "T" in manifest["created"] and manifest["created"].endswith("+00:00")
    assert set(manifest["files"]) == {"engine.plan", "parity.json"}
    for name, record in manifest["files"].items():
        assert record["sha256"] == sha256_file(entry.file(name))
        assert record["size"] == entry.file(name).stat().st_size

    again, status = cache.get_or_create("engine", PARTS, produce, subject="yolo12n")
    assert (status, produce.calls) == ("hit", 1)
    assert again.path == entry.path
    assert cache.lookup("engine", entry.key).status == "hit"


def test_force_rebuilds(tmp_path: Path):
    cache = Cache(tmp_path)
    produce = Producer()
    cache.get_or_create("engine", PARTS, produce)
    entry, status = cache.get_or_create("engine", PARTS, produce, force=True)
    assert (status, produce.calls) == ("forced", 2)
    assert cache.lookup("engine", entry.key).hit
    assert not any((tmp_path / ".trash").iterdir())


def test_lock_is_reentrant_for_its_holder(tmp_path: Path):
    cache = Cache(tmp_path)
    with cache.lock("engine", key_for(PARTS)):
        entry, status = cache.get_or_create("engine", PARTS, Producer())
    assert status == "miss" and cache.lookup("engine", entry.key).hit


def test_produce_error_leaves_nothing(tmp_path: Path):
    cache = Cache(tmp_path)

    def broken(tmp: Path) -> dict:
        (tmp / "engine.plan").write_bytes(b"half")
        raise RuntimeError("builder crashed")

    with pytest.raises(RuntimeError, match="builder crashed"):
        cache.get_or_create("engine", PARTS, broken)
    assert cache.lookup("engine", key_for(PARTS)).status == "miss"
    assert not (tmp_path / "engine" / key_for(PARTS)).exists()
    assert list((tmp_path / ".tmp").iterdir()) == []


def test_produce_may_not_overwrite_reserved_fields(tmp_path: Path):
    cache = Cache(tmp_path)
    with pytest.raises(ValueError, match="key"):
        cache.get_or_create("engine", PARTS, lambda tmp: {"key": "mine"})
    assert list((tmp_path / ".tmp").iterdir()) == []
    assert cache.ls() == []


# --------------------------------------------------------------------------- corruption


def flip_byte(entry_dir: Path) -> None:
    plan = entry_dir / "engine.plan"
    data = bytearray(plan.read_bytes())
    data[len(data) // 2] ^= 0xFF
    plan.write_bytes(bytes(data))


def truncate(entry_dir: Path) -> None:
    plan = entry_dir / "engine.plan"
    plan.write_bytes(plan.read_bytes()[:10])


def delete_file(entry_dir: Path) -> None:
    (entry_dir / "parity.json").unlink()


def garble_manifest(entry_dir: Path) -> None:
    (entry_dir / "manifest.json").write_text("{not json")


@pytest.mark.parametrize(
    "damage, words",
    [
        (flip_byte, "sha256"),
        (truncate, "bytes"),
        (delete_file, "missing"),
        (garble_manifest, "JSON"),
    ],
)
def test_corrupt_entry_is_reported_and_rebuilt(tmp_path: Path, damage, words: str):
    cache = Cache(tmp_path)
    produce = Producer()
    entry, _ = cache.get_or_create("engine", PARTS, produce)

    damage(entry.path)
    result = cache.lookup("engine", entry.key)
    assert result.status == "corrupt" and result.entry is None
    assert words in result.reason
    assert cache.last_corruption and words in cache.last_corruption
    assert not entry.path.exists()  # moved aside, never served
    assert cache.lookup("engine", entry.key).status == "miss"

    cache.get_or_create("engine", PARTS, produce)
    damage(entry.path)
    rebuilt, status = cache.get_or_create("engine", PARTS, produce)
    assert status == "corrupt" and words in cache.last_corruption
    assert produce.calls == 3
    assert cache.lookup("engine", rebuilt.key).hit
    assert [info.valid for info in cache.ls()] == [True]
    assert list((tmp_path / ".trash").iterdir()) == []


def test_ls_reports_corruption_without_removing(tmp_path: Path):
    cache = Cache(tmp_path)
    entry, _ = cache.get_or_create("engine", PARTS, Producer(), subject="yolo12n")
    (info,) = cache.ls()
    assert (info.kind, info.key, info.subject, info.valid) == ("engine", entry.key, "yolo12n", True)
    assert info.size == sum(f.stat().st_size for f in entry.path.iterdir())
    assert info.created is not None and info.last_used >= info.created

    flip_byte(entry.path)
    (info,) = cache.ls()  # sizes only by default: a flipped byte needs the hash
    assert info.valid and not info.verified
    (info,) = cache.ls(verify=True)
    assert not info.valid and "sha256" in info.reason and info.verified
    assert entry.path.exists()


# --------------------------------------------------------------------------- processes


def test_concurrent_builders_build_once(tmp_path: Path, helper: Path):
    root, counter, go = tmp_path / "cache", tmp_path / "counter", tmp_path / "go"
    ready = [tmp_path / "ready0", tmp_path / "ready1"]
    procs = [spawn(helper, "build", root, PARTS, counter, r, go) for r in ready]
    for r, proc in zip(ready, procs):
        wait_for(r, proc)
    go.touch()  # both start get_or_create together; one waits on the lock
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        results.append(json.loads(out))

    assert counter.read_text().splitlines() == ["built"]
    assert sorted(r["status"] for r in results) == ["hit", "miss"]
    assert results[0]["path"] == results[1]["path"]
    assert Cache(root).lookup("engine", key_for(PARTS)).hit


def test_killed_builder_leaves_no_entry(tmp_path: Path, helper: Path):
    root, marker = tmp_path / "cache", tmp_path / "in-produce"
    proc = spawn(helper, "hang", root, PARTS, marker)
    wait_for(marker, proc)
    proc.kill()  # SIGKILL: no cleanup runs
    proc.communicate(timeout=10)

    cache = Cache(root)
    key = key_for(PARTS)
    assert cache.ls() == []
    assert cache.lookup("engine", key).status == "miss"
    (orphan,) = (root / ".tmp").iterdir()
    produce = Producer()
    entry, status = cache.get_or_create("engine", PARTS, produce)  # the lock died with it
    assert status == "miss" and cache.lookup("engine", key).hit
    assert not orphan.exists()  # the rerun cleared the dead build's staging folder
    assert cache.gc() == []
    assert entry.path.exists()


def test_gc_and_purge_skip_locked_entries(tmp_path: Path, helper: Path):
    cache = Cache(tmp_path / "cache")
    held, _ = cache.get_or_create("engine", PARTS, Producer())
    free, _ = cache.get_or_create("engine", with_changes(target={"gpu": "L4"}), Producer())
    marker, release = tmp_path / "holding", tmp_path / "release"
    proc = spawn(helper, "hold", cache.root, {}, held.key, marker, release)
    try:
        wait_for(marker, proc)
        assert cache.gc(max_size_bytes=0) == [free.key]
        assert cache.purge() == []
        assert cache.lookup("engine", held.key).hit
    finally:
        release.touch()
        proc.communicate(timeout=10)
    assert cache.purge() == [held.key]
    assert cache.ls() == []


# --------------------------------------------------------------------------- gc


def test_gc_removes_least_recently_used_first(tmp_path: Path):
    cache = Cache(tmp_path)
    keys = {}
    for name in ("a", "b", "c"):
        entry, _ = cache.get_or_create("engine", with_changes(onnx_sha256=name * 64), Producer())
        keys[name] = entry.key
    now = time.time()
    for age, name in ((300, "a"), (200, "b"), (100, "c")):
        os.utime(cache.entry_dir("engine", keys[name]), (now - age, now - age))
    assert cache.lookup("engine", keys["a"]).hit  # a use: a is now the most recent

    sizes = {info.key: info.size for info in cache.ls()}
    total = sum(sizes.values())
    assert cache.gc(max_size_bytes=total - 1) == [keys["b"]]
    assert cache.gc(max_size_bytes=sizes[keys["a"]]) == [keys["c"]]
    assert cache.gc(max_size_bytes=parse_size("1G")) == []
    assert [info.key for info in cache.ls()] == [keys["a"]]


def test_gc_by_age(tmp_path: Path):
    cache = Cache(tmp_path)
    old, _ = cache.get_or_create("engine", PARTS, Producer())
    new, _ = cache.get_or_create("engine", with_changes(target={"gpu": "L4"}), Producer())
    ten_days_ago = time.time() - 10 * 86400
    os.utime(old.path, (ten_days_ago, ten_days_ago))
    assert cache.gc(max_age_seconds=parse_age("7d")) == [old.key]
    assert [info.key for info in cache.ls()] == [new.key]


# --------------------------------------------------------------------------- explain


def test_explain_names_changed_parts(tmp_path: Path):
    cache = Cache(tmp_path)
    first, _ = cache.get_or_create("engine", PARTS, Producer(), subject="yolo12n")
    small = with_changes(profiles=[[1, 3, 320, 320]])
    cache.get_or_create("engine", small, Producer(), subject="yolo12n")

    assert str(cache.explain("engine", PARTS, subject="yolo12n")) == "hit"

    int8 = with_changes(precision={"mode": "int8", "excluded": []})
    why = cache.explain("engine", int8, subject="yolo12n")
    assert (why.status, why.closest_key, why.changed) == ("miss", first.key, ["precision"])
    assert str(why) == f"miss: differs from entry {first.key[:10]} in: precision"

    rtx = {"name": "tensorrt_rtx", "version": "1.2"}
    both = with_changes(precision={"mode": "int8"}, backend=rtx)
    assert cache.explain("engine", both, subject="yolo12n").changed == ["precision", "backend"]

    other = cache.explain("engine", int8, subject="depth-anything-v2-small")
    assert str(other) == "miss: no earlier entry for this subject"


# --------------------------------------------------------------------------- resolve


def test_resolve_by_prefix(tmp_path: Path):
    cache = Cache(tmp_path)
    entry, _ = cache.get_or_create("engine", PARTS, Producer())
    assert cache.resolve(entry.key[:8]).path == entry.path
    assert cache.resolve(entry.key.upper()).key == entry.key

    unknown = "0123456789" if not entry.key.startswith("0123456789") else "9876543210"
    with pytest.raises(UsageError, match="no cache entry has a key starting with") as exc:
        cache.resolve(unknown)
    assert "\n" not in str(exc.value)
    with pytest.raises(UsageError, match="too short"):
        cache.resolve(entry.key[:5])
    with pytest.raises(UsageError, match="expected hex digits"):
        cache.resolve("not-a-key")

    cache.get_or_create("onnx", PARTS, Producer())  # same parts, another kind: same key
    with pytest.raises(UsageError, match="ambiguous"):
        cache.resolve(entry.key[:8])


# --------------------------------------------------------------------------- size and age


@pytest.mark.parametrize(
    "text, expected",
    [("0", 0), ("512", 512), ("4K", 4096), ("20G", 20 * 1024**3), ("1.5M", 1572864),
     ("2t", 2 * 1024**4), ("20GB", 20 * 1024**3), ("20GiB", 20 * 1024**3), (" 3 M ", 3 * 1024**2)],
)
def test_parse_size(text: str, expected: int):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "-1G", "20X", "1e3", "twenty"])
def test_parse_size_rejects(text: str):
    with pytest.raises(UsageError, match="malformed size"):
        parse_size(text)


@pytest.mark.parametrize(
    "text, expected",
    [("45s", 45), ("10m", 600), ("2h", 7200), ("30d", 30 * 86400), ("1w", 604800), ("1.5h", 5400)],
)
def test_parse_age(text: str, expected: float):
    assert parse_age(text) == expected


@pytest.mark.parametrize("text", ["", "30", "d", "-1d", "3y", "soon"])
def test_parse_age_rejects(text: str):
    with pytest.raises(UsageError, match="malformed age"):
        parse_age(text)
