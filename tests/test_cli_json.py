"""Every verb that prints a table also prints JSON (--json) a script can read, and --help stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from enginekit.cache import Cache

HEAVY = ("torch", "onnx", "onnxruntime", "ultralytics", "transformers", "modelopt", "tensorrt", "tensorrt_rtx",
         "polygraphy", "matplotlib", "numpy")


def test_cache_ls_json_lists_entries_with_their_state(run_cli, tmp_path: Path):
    cache = Cache(tmp_path / "cache")

    def produce(folder: Path):
        (folder / "engine.plan").write_bytes(b"plan")
        (folder / "parity.json").write_text("{}")
        return {"parity": {"passed": False}}

    entry, _ = cache.get_or_create("engine", {"model": "tiny"}, produce, subject="tiny")
    (entry.path / "engine.plan").write_bytes(b"tampered")  # its hash no longer matches: corrupt
    result = run_cli("cache", "ls", "--json", env={"ENGINEKIT_CACHE": str(tmp_path / "cache")})
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["root"] == str(tmp_path / "cache")
    (row,) = data["entries"]
    assert (row["kind"], row["key"], row["subject"]) == ("engine", entry.key, "tiny")
    assert row["valid"] is False and "engine.plan" in row["reason"]
    assert row["size_bytes"] > 0 and row["last_used"]


def test_cache_ls_json_passes_parity_through(run_cli, tmp_path: Path):
    cache = Cache(tmp_path / "cache")
    cache.get_or_create("engine", {"model": "ok"}, lambda f: ((f / "engine.plan").write_bytes(b"x"),
                                                               {"parity": {"passed": True}})[1])
    result = run_cli("cache", "ls", "--json", "--kind", "engine", env={"ENGINEKIT_CACHE": str(tmp_path / "cache")})
    (row,) = json.loads(result.stdout)["entries"]
    assert row["valid"] is True and row["parity_passed"] is True


def test_models_json(run_cli):
    result = run_cli("models", "--json")
    assert result.code == 0, result.stderr
    rows = {r["family"]: r for r in json.loads(result.stdout)}
    assert "yolo12{n,s,m,l,x}" in rows["yolo"]["variants"] and rows["yolo"]["default_input"]
    assert any("small" in v for v in rows["depth-anything-v2"]["variants"])


def test_recipes_ls_json_reports_shipped_and_broken_local_ones(run_cli, tmp_path: Path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "broken.yaml").write_text("model: {variant: yolo12n}\nprecisons: [fp16]\n")
    result = run_cli("recipes", "ls", "--json")
    assert result.code == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["broken"]["origin"] == "local" and rows["broken"]["valid"] is False
    assert "recipes/broken.yaml:2" in rows["broken"]["error"] and "precisons" in rows["broken"]["error"]
    shipped = rows["yolo12n"]
    assert shipped["origin"] == "shipped" and shipped["valid"] and shipped["model"] == "yolo12n"
    assert shipped["precisions"] and shipped["profiles"] and shipped["targets"]


def test_doctor_json_lists_every_gpu(run_cli):
    """Two GPUs through a stand-in NVML (tests/fake_nvml), in CUDA_VISIBLE_DEVICES order; none when hidden."""
    import os

    fake = str(Path(__file__).parent / "fake_nvml")
    path = os.pathsep.join(p for p in (fake, os.environ.get("PYTHONPATH")) if p)
    result = run_cli("doctor", "--json", env={"PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": "1,0"})
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [(g["name"], g["compute_capability"], g["index"]) for g in data["gpus"]] == [
        ("NVIDIA L4", "8.9", 1), ("NVIDIA H100 80GB HBM3", "9.0", 0)]
    assert data["gpus"][1]["memory_bytes"] == 85899345920
    assert data["gpu"] == {"name": "NVIDIA L4", "compute_capability": "8.9"}  # the first CUDA would use
    hidden = run_cli("doctor", "--json", env={"PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""})
    assert hidden.code == 0, hidden.stderr
    data = json.loads(hidden.stdout)
    assert data["gpus"] == [] and data["gpu"] is None


@pytest.mark.parametrize("verb", [[], ["cache", "ls"], ["doctor"], ["models"], ["bench"], ["recipes", "ls"]])
def test_help_imports_nothing_heavy(verb):
    code = ("import sys; from enginekit.cli import main; sys.argv = ['enginekit', *sys.argv[1:], '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code, *verb], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
