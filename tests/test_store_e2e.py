"""End to end through the team store: a yolo12n FP16 engine built and verified on one machine (the
suite's cache, read-write credentials) is used by ``build``, ``verify`` and ``load()`` on another (an
empty cache, read-only credentials), bytes identical, and found by identity where the other machine's
library versions differ from the builder's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enginekit import api, reporting
from enginekit.cache import Cache
from enginekit.store.settings import using
from s3server import RO, RW
from test_store import s3, store  # noqa: F401 - the server fixtures

pytestmark = pytest.mark.slow


def test_an_engine_built_and_verified_on_one_machine_serves_another(store, s3, cache, yolo_export, tmp_path,
                                                                     run_cli, monkeypatch):
    # the builder: the suite's cache (the FP16 chain is yolo_export's), pushing as CI does
    with using(store):
        built = api.build("yolo12n", random_init=True, precision="fp16", cache=cache, quiet=True)
        verified = api.verify("yolo12n", precision="fp16", task_required=False, build_options={"random_init": True},
                              cache=cache,
                              quiet=True)
    assert verified.passed and built.manifest["parity"]["passed"] is True
    names = s3.objects(store.split("/", 3)[3])
    assert f"entries/engine/{built.entry.key}.json" in names
    assert any(n.startswith(f"reports/{built.entry.key}/") for n in names)  # the verify report travels too
    fp16_graph = next(a for a in built.artifacts if a.stage == "fp16") if built.artifacts else None

    deploy = {**s3.env(RO), "ENGINEKIT_CACHE": str(tmp_path / "deploy"), "ENGINEKIT_REMOTE": store,
              "ENGINEKIT_REMOTE_MODE": "read"}
    engine = run_cli("build", "yolo12n", "--random-init", "--precision", "fp16", env=deploy)
    assert engine.code == 0, engine.stderr
    assert "found by identity" in engine.stderr and built.entry.key[:12] in engine.stderr
    assert "export" not in [line.split()[1] for line in engine.stderr.splitlines() if line.strip().startswith("✓")]
    assert Path(engine.stdout.strip()).read_bytes() == built.engine.read_bytes()

    checked = run_cli("verify", "yolo12n", "--random-init", "--precision", "fp16", "--task-optional",
                      env={**deploy, "ENGINEKIT_CACHE": str(tmp_path / "deploy-verify")})
    assert checked.code == 0, checked.stderr
    assert "pulled onnx-fp16" in checked.stderr and "Traceback" not in checked.stderr

    for name, value in s3.env(RO).items():
        monkeypatch.setenv(name, value)
    empty = Cache(tmp_path / "deploy-load")
    predictor = api.load("yolo12n", precision="fp16", random_init=True, backend="onnxruntime-cpu", cache=empty,
                         remote=store, remote_read_only=True)
    result = predictor(np.full((480, 640, 3), 114, np.uint8))
    assert result.boxes.shape[1] == 4
    pulled = Cache(tmp_path / "deploy-load", remote=None).entries("onnx-fp16")
    assert len(pulled) == 1
    if fp16_graph is not None:
        assert pulled[0].file("model.onnx").read_bytes() == fp16_graph.path.read_bytes()
    assert Path(predictor.source).read_bytes() == yolo_export.artifacts[-1].path.read_bytes()


def test_other_library_versions_find_the_engine_by_identity(store, s3, cache, tmp_path, monkeypatch):
    with using(store):
        built = api.build("yolo12n", random_init=True, precision="fp16", cache=cache, quiet=True)
    import enginekit.pipeline as pipeline

    real = pipeline.model_versions
    monkeypatch.setattr(pipeline, "model_versions", lambda adapter: {**real(adapter), "torch": "9.9.9"})
    for name, value in s3.env(RO).items():
        monkeypatch.setenv(name, value)
    with using(store, read_only=True):
        other = api.build("yolo12n", random_init=True, precision="fp16", cache=Cache(tmp_path / "other"), quiet=True)
    stages = [e.label for e in other.events if e.kind == "stage"]
    assert not any(s.startswith(("load", "export", "fp16")) for s in stages), stages  # nothing built, no model
    assert other.engine.read_bytes() == built.engine.read_bytes()
    assert other.resolution and built.entry.key[:12] in other.resolution and "found by identity" in other.resolution
    # a GPU the store has no engine for: one line naming the hardware it has engines for
    from enginekit.flows.store import resolve_engine
    from enginekit.store.identity import Wanted, identity_of

    with using(store, read_only=True), reporting.collecting():
        miss = resolve_engine(Cache(tmp_path / "third"), identity_of(built.manifest),
                              Wanted("tensorrt-rtx", "0.0.1", ("8.9",), "NVIDIA L4 (8.9)"))
    assert miss.entry is None and "\n" not in miss.reason
    assert "tensorrt-rtx" in miss.reason and "7.5,8.0,8.6,8.9,12.0" in miss.reason
