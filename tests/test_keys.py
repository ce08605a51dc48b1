"""Cache keys hold everything that determines a result; --explain names the key actually used;
a corrupt entry's reason is shown, not only rebuilt."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _versions(monkeypatch, **changed):
    """package_version as installed, except the names in ``changed``."""
    import enginekit.pipeline as pipeline

    real = pipeline.package_version
    table = {k.replace("_", "-"): v for k, v in changed.items()}
    monkeypatch.setattr(pipeline, "package_version", lambda name: table.get(name, real(name)))


def test_hub_weights_keyed_by_the_downloaded_file_content(tmp_path, monkeypatch):
    """Two files behind the same hub name are two identities (Ultralytics resolves yolov8n.pt locally first)."""
    from enginekit.pipeline import ModelRequest

    monkeypatch.chdir(tmp_path)
    (tmp_path / "yolov8n.pt").write_bytes(b"first release")
    first = ModelRequest("yolov8n").weights_identity
    (tmp_path / "yolov8n.pt").write_bytes(b"re-released weights")
    second = ModelRequest("yolov8n").weights_identity
    assert first.startswith("sha256:") and second.startswith("sha256:") and first != second


def test_depth_hub_weights_keyed_by_content(tmp_path, monkeypatch):
    import huggingface_hub

    from enginekit.pipeline import ModelRequest

    weights = tmp_path / "model.safetensors"
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name: str(weights))
    weights.write_bytes(b"a")
    first = ModelRequest("depth").weights_identity
    weights.write_bytes(b"b")
    assert ModelRequest("depth").weights_identity != first


def test_hub_weights_offline_is_one_line(tmp_path, monkeypatch):
    from enginekit.errors import UsageError
    from enginekit.pipeline import ModelRequest

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("ultralytics.utils.downloads.attempt_download_asset",
                        lambda name: (_ for _ in ()).throw(ConnectionError("offline")))
    with pytest.raises(UsageError, match="cannot download yolov8n.pt"):
        ModelRequest("yolov8n").weights_identity  # noqa: B018


@pytest.mark.parametrize("name, family", [("ultralytics", "yolo12n"), ("transformers", "depth"), ("torch", "yolo12n")])
def test_reference_key_holds_the_model_libraries(tmp_path, monkeypatch, name, family):
    from enginekit.cache import Cache
    from enginekit.calibration import CalibrationData
    from enginekit.pipeline import ModelRequest, Stages
    from enginekit.verification import references

    pipe = Stages(ModelRequest(family, None, True, 0), Cache(tmp_path))
    seen = []
    monkeypatch.setattr(pipe.cache, "get_or_create", lambda kind, parts, *a, **k: seen.append(parts) or 1 / 0)
    profile = [{pipe.adapter.input_name: {k: [1, 3, 224, 224] for k in ("min", "opt", "max")}}]
    for version in ("1.0", "2.0"):
        _versions(monkeypatch, **{name: version})
        with pytest.raises(ZeroDivisionError):
            references.get_references(pipe, profile, CalibrationData(None, count=1))
    assert seen[0]["versions"][name] == "1.0" and seen[1]["versions"][name] == "2.0"
    from enginekit.hashing import key_for

    assert key_for(seen[0]) != key_for(seen[1])


@pytest.mark.parametrize("package", ["nvidia-modelopt", "onnxruntime-gpu"])
@pytest.mark.parametrize("stage", ["int8", "fp8", "fp16"])
def test_quantization_keys_hold_modelopt_and_onnxruntime(tmp_path, monkeypatch, package, stage):
    from enginekit.cache import Cache
    from enginekit.calibration import CalibrationData
    from enginekit.pipeline import Artifact, ModelRequest, Stages

    if package == "onnxruntime-gpu" and __import__("enginekit.pipeline").pipeline.package_version(package) == "absent":
        package = "onnxruntime"
    pipe = Stages(ModelRequest("yolo12n", None, True, 0), Cache(tmp_path))
    keys = []
    hit = __import__("types").SimpleNamespace(status="hit")
    monkeypatch.setattr(pipe, "stage", lambda st, parts, produce, label: keys.append(parts) or hit)
    source = tmp_path / "m.onnx"
    source.write_bytes(b"graph")
    art = Artifact.given(source)
    data = CalibrationData(None, count=1)
    for version in ("1.0", "2.0"):
        _versions(monkeypatch, **{package: version})
        if stage == "int8":
            pipe.int8(art, (1, 3, 64, 64), data, method="max")
        elif stage == "fp8":
            pipe.fp8(art, (1, 3, 64, 64), data)
        else:
            pipe.fp16(art, (1, 3, 64, 64), data)
    from enginekit.hashing import key_for

    assert key_for(keys[0]) != key_for(keys[-1]), keys


def test_corrupt_entry_reason_is_shown(tmp_path):
    from enginekit import reporting
    from enginekit.cache import Cache

    cache = Cache(tmp_path)

    def produce(tmp: Path) -> dict:
        (tmp / "engine.plan").write_bytes(b"x" * 4096)
        return {}

    entry, _ = cache.get_or_create("engine", {"a": 1}, produce)
    with open(entry.file("engine.plan"), "r+b") as f:
        f.truncate(100)
    with reporting.collecting(quiet=True) as seen:
        _, status = cache.get_or_create("engine", {"a": 1}, produce)
    assert status == "corrupt"
    warnings = [e for e in seen.events if e.kind == "warning"]
    assert len(warnings) == 1, seen.events
    text = warnings[0].label
    assert f"engine/{entry.key[:12]}" in text and "corrupt" in text and "engine.plan" in text, text


def test_explain_with_repair_names_the_key_used(tmp_path):
    """--repair puts the repaired nodes in the engine key: --explain must compute that key, not the one before.
    On a model whose FP16 graph fails the limit (tiny_family.py: rel L2 1.4e-3 against 1e-6), so the repair
    keeps nodes and the key after it differs from the key before (a gate that passes would keep none)."""
    import os
    import re
    import subprocess
    import sys

    tests = Path(__file__).resolve().parent
    env = dict(os.environ, ENGINEKIT_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))
    code = "import tiny_family; from enginekit.cli import main; main()"

    def build(*extra):
        args = ["build", "tiny-colours", "--random-init", "--profile", "1x3x96x128", "--precision", "fp16", *extra]
        return subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)

    args = ("--repair", "--no-verify", "--tol", "rel_l2=1e-6")
    first = build(*args)
    assert first.returncode == 0, first.stderr
    kept = re.search(r"repair: (\d+) of \d+ quantizable node", first.stderr)
    assert kept and int(kept.group(1)) > 0, first.stderr
    second = build(*args, "--explain")
    assert second.returncode == 0, second.stderr
    assert "explain engine: hit" in second.stderr, second.stderr
    # the key before repair is another engine's: the repaired nodes are in the precision part
    plain = build("--no-verify", "--explain")
    assert plain.returncode == 0, plain.stderr
    assert re.search(r"explain engine: miss: differs from entry \w+ in: .*precision", plain.stderr), plain.stderr


def test_engine_key_precision_part_is_unchanged():
    """The engine key's precision part, as caches already hold it: a float graph's mode alone (plus the
    nodes a repair kept), a quantized graph's method, excludes and calibration too."""
    from enginekit.precisions import PRECISIONS, get, of_stage

    assert get("fp32").key() == {"mode": "fp32"} and get("fp16").key() == {"mode": "fp16"}
    assert get("fp16").key(repaired_nodes=["/m/Conv"]) == {"mode": "fp16", "repaired_nodes": ["/m/Conv"]}
    assert get("int8").key("entropy", None, "8 photographs") == {
        "mode": "int8", "method": "entropy", "exclude": [], "calibration": "8 photographs"}
    fp8 = get("fp8")
    assert fp8.key(fp8.method, ["/m/Add"], "c") == {"mode": "fp8", "method": "max", "exclude": ["/m/Add"],
                                                    "calibration": "c"}
    # every engine of a precision is built from its own stage's graph; verify reads a chain back the same way
    assert [of_stage(p.stage) for p in PRECISIONS.values()] == list(PRECISIONS)
    assert (of_stage("export"), of_stage("int8-repair"), of_stage("input")) == ("fp32", "int8", None)
    assert not fp8.runs_on("8.6") and fp8.runs_on("8.9") and fp8.runs_on("12.0") and get("int8").runs_on("7.5")
