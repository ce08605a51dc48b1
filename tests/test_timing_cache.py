"""TensorRT 10/11 timing caches kept in the cache, and what the builder hands Polygraphy for TensorRT proper.

TensorRT proper cannot build here (no GPU, no wheel): its path is checked with stand-ins for the
tensorrt module and Polygraphy's loaders, which record what they are given and write timings the
way ``EngineBytesFromNetwork(save_timing_cache=)`` does (into the file it is given). The real thing
is ``test_trt.py::test_timing_cache_kept_and_reused_on_a_gpu`` (marked tensorrt, gpu).
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from enginekit import reporting
from enginekit.cache import Cache
from enginekit.hashing import key_for
from enginekit.shapes import parse_profile
from enginekit.trt import builder, timing
from enginekit.trt.flavours import TRAITS, Flavour, GpuInfo
from enginekit.trt.builder import BuildOptions, build_engine
from enginekit.trt.timing import FILE, KIND, kept_timing_cache, timing_cache_parts

ADA = GpuInfo("NVIDIA GeForce RTX 4090", "8.9")
AMPERE = GpuInfo("NVIDIA RTX A4000", "8.6")


def fake_tensorrt(version: str) -> types.ModuleType:
    """Just enough of a tensorrt module for the builder's own code (no GPU code runs)."""
    module = types.ModuleType("tensorrt")
    module.__version__ = version

    class ILogger:
        class Severity:
            INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

        def __init__(self) -> None:
            pass

    module.ILogger = ILogger
    module.DataType = types.SimpleNamespace(FLOAT=types.SimpleNamespace(name="FLOAT"))  # no FP8
    module.BuilderFlag = types.SimpleNamespace(TF32="TF32")
    module.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
    return module


def backend_for(row: str = "tensorrt-10", version: str = "10.13.3.9") -> Flavour:
    return Flavour(name=row, version=version, traits=TRAITS[row], module=fake_tensorrt(version))


class FakePolygraphy:
    """Polygraphy's loaders as the builder calls them; ``calls`` records each with its arguments."""

    def __init__(self, timings: bytes = b"T") -> None:
        self.calls: list[tuple[str, dict]] = []
        self.timings = timings

    def NetworkFromOnnxPath(self, path: str, strongly_typed: bool):  # noqa: N802 - Polygraphy's name
        self.calls.append(("NetworkFromOnnxPath", {"path": path, "strongly_typed": strongly_typed}))
        tensor = lambda name, shape: types.SimpleNamespace(  # noqa: E731
            name=name, shape=shape, dtype=types.SimpleNamespace(name="FLOAT"), is_shape_tensor=False)
        network = types.SimpleNamespace(num_inputs=1, get_input=lambda i: tensor("x", [-1, 3, 16, 16]),
                                        num_outputs=1, get_output=lambda i: tensor("y", [-1, 4, 16, 16]),
                                        num_layers=0)
        fresh = types.SimpleNamespace(profiling_verbosity="LAYER_NAMES_ONLY", get_flag=lambda flag: flag == "TF32")
        trt_builder = types.SimpleNamespace(create_builder_config=lambda: fresh)
        return lambda: (trt_builder, network, "parser")

    def Profile(self):  # noqa: N802
        profile = {}
        profile_add = lambda name, lo, opt, hi: profile.update({name: (lo, opt, hi)}) or profile  # noqa: E731
        return types.SimpleNamespace(add=profile_add, shapes=profile)

    def CreateConfig(self, **kwargs):  # noqa: N802
        loaded = kwargs["load_timing_cache"]
        self.calls.append(("CreateConfig", {**kwargs, "loaded_bytes": Path(loaded).read_bytes() if loaded else None}))
        return lambda builder, network: types.SimpleNamespace(num_optimization_profiles=len(kwargs["profiles"]))

    def EngineBytesFromNetwork(self, network, config, save_timing_cache=None):  # noqa: N802
        self.calls.append(("EngineBytesFromNetwork", {"save_timing_cache": save_timing_cache}))

        def build() -> bytes:
            if save_timing_cache:  # Polygraphy: the config's timing cache, the file's merged in, saved
                path = Path(save_timing_cache)
                path.write_bytes((path.read_bytes() if path.exists() else b"") + self.timings)
            return b"plan"

        return build

    def call(self, name: str) -> dict:
        return [kwargs for called, kwargs in self.calls if called == name][-1]


@pytest.fixture
def on_gpu(monkeypatch):
    """A machine with an Ada GPU, and Polygraphy replaced by ``FakePolygraphy``."""
    poly = FakePolygraphy()
    monkeypatch.setattr(builder, "gpu_info", lambda: ADA)
    monkeypatch.setattr(builder, "bind", lambda backend: poly)
    return poly


@pytest.fixture
def onnx_file(tmp_path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"parsed by the stand-in")
    return path


DYNAMIC = [parse_profile("1x3x16x16:2x3x16x16:4x3x16x16")]


# --- what Polygraphy is given for TensorRT proper ------------------------------------------


@pytest.mark.parametrize("row, version, flagged", [("tensorrt-10", "10.13.3.9", True), ("tensorrt-11", "11.4.0.1", False)])
def test_tensorrt_build_settings_reach_polygraphy(on_gpu, onnx_file, tmp_path, row, version, flagged):
    cache_file = tmp_path / "timing.cache"
    cache_file.write_bytes(b"kept")
    options = BuildOptions(workspace_bytes=1 << 30, optimization_level=4)
    result = build_engine(onnx_file, DYNAMIC, backend_for(row, version), options, timing_cache=cache_file)
    assert on_gpu.call("NetworkFromOnnxPath")["strongly_typed"] is flagged  # the row's flag, not a guess
    config = on_gpu.call("CreateConfig")
    assert config["tf32"] is True  # TensorRT's default kept (CreateConfig alone would turn it off)
    assert config["profiling_verbosity"] == "LAYER_NAMES_ONLY"  # TensorRT's default (Polygraphy's: DETAILED)
    assert config["memory_pool_limits"] == {"WORKSPACE": 1 << 30} and config["builder_optimization_level"] == 4
    assert [p.shapes for p in config["profiles"]] == [{"x": ((1, 3, 16, 16), (2, 3, 16, 16), (4, 3, 16, 16))}]
    assert config["load_timing_cache"] == str(cache_file) and config["loaded_bytes"] == b"kept"
    assert on_gpu.call("EngineBytesFromNetwork")["save_timing_cache"] == str(cache_file)
    assert result.plan == b"plan" and result.timing_cache_used and result.gpu == ADA and result.targets == ("8.9",)
    assert cache_file.read_bytes() == b"keptT"


def test_a_first_build_starts_a_timing_cache(on_gpu, onnx_file, tmp_path):
    cache_file = tmp_path / "timing.cache"
    messages: list[str] = []
    build_engine(onnx_file, DYNAMIC, backend_for(), timing_cache=cache_file, progress=messages.append)
    assert on_gpu.call("CreateConfig")["load_timing_cache"] is None  # nothing to load: no "not found" warning
    assert cache_file.read_bytes() == b"T" and "timing cache: new" in messages


# --- the timing cache kept in the cache -------------------------------------------------------


def _build(cache: Cache, backend: Flavour, gpu: GpuInfo | None, poly: FakePolygraphy, onnx_file: Path,
           monkeypatch) -> Path | None:
    monkeypatch.setattr(builder, "gpu_info", lambda: gpu)
    monkeypatch.setattr(builder, "bind", lambda _backend: poly)
    with kept_timing_cache(cache, backend, gpu) as path:
        if gpu is not None:
            build_engine(onnx_file, DYNAMIC, backend, timing_cache=path)
    return path


def _kept(cache: Cache, backend: Flavour, gpu: GpuInfo) -> bytes | None:
    found = cache.lookup(KIND, key_for(timing_cache_parts(backend, gpu)))
    return found.entry.file(FILE).read_bytes() if found.entry is not None else None


def test_timing_cache_kept_per_backend_and_gpu_and_reused(tmp_path, onnx_file, monkeypatch):
    cache = Cache(tmp_path / "cache")
    trt10 = backend_for()
    first = FakePolygraphy(b"[first]")
    _build(cache, trt10, ADA, first, onnx_file, monkeypatch)
    assert first.call("CreateConfig")["load_timing_cache"] is None
    assert _kept(cache, trt10, ADA) == b"[first]"

    second = FakePolygraphy(b"[second]")  # another engine on the same GPU: starts from the first's timings
    with reporting.collecting(quiet=True) as events:
        _build(cache, trt10, ADA, second, onnx_file, monkeypatch)
    assert second.call("CreateConfig")["loaded_bytes"] == b"[first]"
    assert _kept(cache, trt10, ADA) == b"[first][second]"
    assert any("timing cache for NVIDIA GeForce RTX 4090 (8.9): kept" in e.label for e in events.of("note"))

    other_gpu = FakePolygraphy(b"[ampere]")
    _build(cache, trt10, AMPERE, other_gpu, onnx_file, monkeypatch)
    assert other_gpu.call("CreateConfig")["load_timing_cache"] is None  # another GPU's timings are not this one's
    newer = FakePolygraphy(b"[10.14]")
    _build(cache, backend_for(version="10.14.1.48"), ADA, newer, onnx_file, monkeypatch)
    assert newer.call("CreateConfig")["load_timing_cache"] is None  # TensorRT refuses another version's cache
    assert _kept(cache, trt10, ADA) == b"[first][second]" and _kept(cache, trt10, AMPERE) == b"[ampere]"
    assert timing_cache_parts(trt10, ADA) == {"backend": {"name": "tensorrt-10", "version": "10.13.3.9"},
                                              "gpu": {"name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9"}}


def test_no_timing_cache_for_tensorrt_rtx_or_without_gpu(tmp_path, onnx_file, monkeypatch):
    cache = Cache(tmp_path / "cache")
    rtx = Flavour(name="tensorrt-rtx", version="1.7.1.116", traits=TRAITS["tensorrt-rtx"], module=fake_tensorrt("1.7"))
    with kept_timing_cache(cache, rtx, ADA) as path:  # TensorRT-RTX's timing-cache calls are no-ops
        assert path is None
    with kept_timing_cache(cache, backend_for(), None) as path:
        assert path is None
    assert not (cache.root / KIND).exists()


def test_a_failed_build_keeps_the_timing_cache_as_it_was(tmp_path, onnx_file, monkeypatch):
    cache = Cache(tmp_path / "cache")
    trt10 = backend_for()
    _build(cache, trt10, ADA, FakePolygraphy(b"[good]"), onnx_file, monkeypatch)
    with pytest.raises(RuntimeError, match="builder crashed"):
        with kept_timing_cache(cache, trt10, ADA) as path:
            path.write_bytes(b"half written")
            raise RuntimeError("builder crashed")
    assert _kept(cache, trt10, ADA) == b"[good]"


def test_two_builds_at_once_keep_both_timings(tmp_path, onnx_file, monkeypatch):
    """Both start from one entry; the second to finish merges the first one's timings in."""
    cache = Cache(tmp_path / "cache")
    trt10 = backend_for()
    _build(cache, trt10, ADA, FakePolygraphy(b"[base]"), onnx_file, monkeypatch)
    merged: list[tuple[bytes, bytes]] = []

    def merge(backend, into: Path, other: Path) -> bool:  # TensorRT's ITimingCache.combine, as a union
        merged.append((into.read_bytes(), other.read_bytes()))
        into.write_bytes(other.read_bytes() + into.read_bytes().removeprefix(b"[base]"))
        return True

    with kept_timing_cache(cache, trt10, ADA, merge=merge) as slow:
        with kept_timing_cache(cache, trt10, ADA, merge=merge) as fast:
            assert slow.read_bytes() == fast.read_bytes() == b"[base]"
            fast.write_bytes(b"[base][fast]")
        assert _kept(cache, trt10, ADA) == b"[base][fast]" and not merged  # nobody published in between
        slow.write_bytes(b"[base][slow]")
    assert merged == [(b"[base][slow]", b"[base][fast]")]
    assert _kept(cache, trt10, ADA) == b"[base][fast][slow]"


def test_timing_cache_unchanged_is_not_rewritten(tmp_path, onnx_file, monkeypatch):
    cache = Cache(tmp_path / "cache")
    trt10 = backend_for()
    _build(cache, trt10, ADA, FakePolygraphy(b"[t]"), onnx_file, monkeypatch)
    before = cache.lookup(KIND, key_for(timing_cache_parts(trt10, ADA))).entry.manifest["created"]
    with kept_timing_cache(cache, trt10, ADA):
        pass  # a build that timed nothing new leaves the file as loaded
    assert cache.lookup(KIND, key_for(timing_cache_parts(trt10, ADA))).entry.manifest["created"] == before


def test_merge_is_tensorrts_combine(tmp_path):
    """Two copies merged with ITimingCache.combine (a stand-in here); one TensorRT refuses stays as it was."""
    backend = backend_for()

    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def combine(self, other: "TimingCache", ignore_mismatch: bool) -> bool:
            if ignore_mismatch or other.data.startswith(b"foreign"):
                return False
            self.data += other.data
            return True

        def serialize(self) -> bytes:
            return self.data

    config = types.SimpleNamespace(create_timing_cache=TimingCache)
    backend.module.Builder = lambda logger: types.SimpleNamespace(create_builder_config=lambda: config)
    ours, theirs, foreign = tmp_path / "ours", tmp_path / "theirs", tmp_path / "foreign"
    ours.write_bytes(b"[ours]")
    theirs.write_bytes(b"[theirs]")
    foreign.write_bytes(b"foreign GPU")
    assert timing.merge_timing_caches(backend, ours, theirs) and ours.read_bytes() == b"[ours][theirs]"
    assert not timing.merge_timing_caches(backend, ours, foreign) and ours.read_bytes() == b"[ours][theirs]"
