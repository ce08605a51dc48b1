"""The shipped recipes travel with the package: a wheel (not an editable install) finds them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")  # a copy: building writes build/ and egg-info beside the sources
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    if done.returncode != 0 and "No module named" in done.stderr:
        pytest.skip(f"cannot build a wheel here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    (path,) = out.glob("enginekit-*.whl")
    return path


def test_wheel_holds_every_shipped_recipe(wheel: Path):
    shipped = sorted(p.name for p in (REPO / "src" / "enginekit" / "shipped_recipes").glob("*.yaml"))
    names = zipfile.ZipFile(wheel).namelist()
    assert shipped and sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("enginekit/shipped_recipes/")) == shipped


def test_installed_wheel_lists_and_loads_its_recipes(wheel: Path, tmp_path: Path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip install puts in site-packages
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    code = ("import enginekit, enginekit.recipes as r; "
            "print(enginekit.__file__); print(sorted(x.name for x in r.list_recipes() if x.origin == 'shipped'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(site)))
    assert done.returncode == 0, done.stderr
    location, names = done.stdout.strip().splitlines()
    assert location.startswith(str(site))
    assert "yolo12n" in names and "depth-anything-v2-small" in names
