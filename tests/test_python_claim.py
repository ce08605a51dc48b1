"""The Python versions pyproject claims are the ones the code runs on.

``requires-python`` is a promise to every installer: the lowest version it names must parse
every module (``ast`` with that ``feature_version``) and have every standard-library name the
code uses (vermin knows which version brought each; ``hashlib.file_digest`` is 3.11's), and the
interpreter running the suite must be one it admits.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "src" / "enginekit").rglob("*.py"))


def claimed() -> SpecifierSet:
    return SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])


def lowest_claimed() -> tuple[int, int]:
    """The lowest minor version ``requires-python`` admits (it must name one with >=)."""
    spec = claimed()
    floors = [Version(s.version) for s in spec if s.operator in (">=", "~=", "==")]
    assert floors, f"requires-python {spec} names no lowest version"
    low = max(floors)
    assert low in spec, f"requires-python {spec} excludes its own lowest version {low}"
    return low.major, low.minor


def test_this_interpreter_is_one_the_claim_admits():
    running = ".".join(map(str, sys.version_info[:3]))
    assert Version(running) in claimed(), f"Python {running} runs the suite, but pyproject claims {claimed()}"


def test_every_module_parses_at_the_lowest_claimed_python():
    low = lowest_claimed()
    problems = []
    for path in SOURCES:
        try:
            ast.parse(path.read_text(), str(path), feature_version=low)
        except SyntaxError as exc:
            problems.append(f"{path.relative_to(ROOT)}:{exc.lineno}: {exc.msg}")
    assert not problems, f"syntax newer than Python {low[0]}.{low[1]}:\n" + "\n".join(problems)


def test_the_lowest_claimed_python_has_what_the_code_uses():
    vermin = pytest.importorskip("vermin", reason="vermin (the test extra) finds the version each name needs")
    config = vermin.Config()
    needs = {}
    for path in SOURCES:
        minimum = vermin.visit(path.read_text(), config).minimum_versions()[1]  # [Python 2, Python 3]
        if minimum:
            needs[path.relative_to(ROOT).as_posix()] = tuple(minimum)
    low = lowest_claimed()
    newer = {path: f"{v[0]}.{v[1]}" for path, v in needs.items() if v > low}
    assert not newer, f"pyproject claims Python {low[0]}.{low[1]}, but these need newer: {newer}"
    assert needs, "vermin found no version requirement at all: the check compares nothing"


def test_the_check_sees_a_newer_name(tmp_path):
    """What the checks above would catch: 3.11's hashlib.file_digest under a 3.10 claim, 3.12 syntax."""
    vermin = pytest.importorskip("vermin")
    code = "import hashlib\n\ndef digest(f):\n    return hashlib.file_digest(f, 'sha256')\n"
    assert tuple(vermin.visit(code, vermin.Config()).minimum_versions()[1]) == (3, 11)
    with pytest.raises(SyntaxError):
        ast.parse("type Shape = tuple[int, ...]\n", feature_version=(3, 11))
