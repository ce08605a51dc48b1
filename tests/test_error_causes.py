"""Errors the library raises keep what caused them (``raise ... from exc``): an API user who asks for
detail (a traceback, ``exc.__cause__``) gets the parser's or the client's own error, while the command
line still prints one line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from enginekit.errors import EnginekitError

SRC = Path(__file__).resolve().parents[1] / "src" / "enginekit"


def test_a_malformed_recipe_keeps_the_yaml_error(tmp_path):
    from enginekit.recipes import load_recipe

    bad = tmp_path / "bad.yaml"
    bad.write_text("model: yolo12n\nprecisions: [fp16\n")
    with pytest.raises(EnginekitError) as caught:
        load_recipe(bad)
    assert "malformed YAML" in str(caught.value)
    assert isinstance(caught.value.__cause__, yaml.YAMLError)


def test_a_bad_tolerance_keeps_its_parse_error():
    from enginekit.compare.tolerances import parse_limit

    with pytest.raises(EnginekitError) as caught:
        parse_limit("scores.max_abs=abc")
    assert "malformed --tol" in str(caught.value) and isinstance(caught.value.__cause__, ValueError)


def test_the_library_never_drops_a_cause():
    """``from None`` hides the cause; only the command line's exits (one line, no traceback) may use it."""
    dropped = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.cause, ast.Constant) and node.cause.value is None:
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if not ast.unparse(raised).endswith("Exit"):
                    dropped.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not dropped, dropped
