"""verify names what it checked: a corrupt entry on an engine's chain fails the run, named."""

from __future__ import annotations

import shutil

import pytest

from conftest import assert_one_line_error


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """A private cache holding one yolo12n fp32 engine (its export and simplify entries too)."""
    from enginekit import api
    from enginekit.cache import Cache

    root = tmp_path_factory.mktemp("verify-corrupt") / "cache"
    cache = Cache(root)
    outcome = api.build("yolo12n", profiles=["1x3x256x256"], random_init=True, verify=False, cache=cache)
    return root, outcome.entry.key


@pytest.fixture
def cache_copy(built_cache, tmp_path):
    root, key = built_cache
    copy = tmp_path / "cache"
    shutil.copytree(root, copy, symlinks=True)
    return copy, key


def _corrupt(root, kind: str) -> str:
    (entry,) = (root / kind).iterdir()
    target = next(p for p in sorted(entry.iterdir()) if p.name != "manifest.json")
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return entry.name


@pytest.mark.parametrize("how", ["all", "key"])
def test_corrupt_source_graph_fails_verify_naming_it(run_cli, cache_copy, how):
    root, engine_key = cache_copy
    bad = _corrupt(root, "onnx-simplify")
    args = ["verify"] + ([engine_key[:12]] if how == "key" else [])
    result = run_cli(*args, env={"ENGINEKIT_CACHE": str(root)})
    assert_one_line_error(result, 1, f"onnx-simplify/{bad[:12]}", "corrupt")
    assert "removed by gc" not in result.stderr


def test_only_engine_corrupt_is_named_not_no_engines(run_cli, cache_copy):
    root, engine_key = cache_copy
    _corrupt(root, "engine")
    result = run_cli("verify", env={"ENGINEKIT_CACHE": str(root)})
    assert_one_line_error(result, 1, f"engine/{engine_key[:12]}", "corrupt")
    assert "no engines" not in result.stderr


def test_report_never_says_a_graph_was_checked_when_none_was(cache_copy):
    from enginekit import api
    from enginekit.cache import Cache

    root, engine_key = cache_copy
    _corrupt(root, "onnx-simplify")
    _corrupt(root, "onnx-export")
    outcome = api.verify(engine_key[:12], cache=Cache(root), quiet=True)
    (report,) = outcome.reports
    assert not outcome.passed
    engine = report.artifacts[-1]
    assert not engine.ran
    assert "checked instead" not in engine.reason and "none of its source graphs" in engine.reason
    corrupt = [a for a in report.artifacts if "corrupt" in a.reason]
    assert [a.name for a in corrupt] == ["onnx-export", "onnx-simplify"]
    assert all(not a.passed for a in corrupt)


def test_engine_reason_names_the_graphs_that_were_checked(cache_copy):
    from enginekit import api
    from enginekit.cache import Cache

    root, engine_key = cache_copy
    _corrupt(root, "onnx-simplify")
    outcome = api.verify(engine_key[:12], cache=Cache(root), quiet=True)
    engine = outcome.reports[0].artifacts[-1]
    if not engine.ran:  # no GPU here: says which source graph stood in, and only that one
        assert "onnx-export checked instead" in engine.reason and "onnx-simplify" not in engine.reason
