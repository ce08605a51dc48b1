"""The comparison first asks whether it compares anything: a reference output that is the same for
every input (a random-weight YOLO's anchor grid and constant scores) gives a check that cannot fail,
so it is never reported as a pass. Pure numpy: no model, no graph."""

from __future__ import annotations

import numpy as np
import pytest

from enginekit.compare.comparison import VARIES, Case, Gates, GraphOutputs, compare, input_variation
from enginekit.compare.parts import Tolerance


def _adapter():
    return GraphOutputs(("y",), Tolerance(rel_l2=1e-3, cosine=0.999))


def _cases(outputs):
    return [Case(f"in{i}", "photo", {"x": np.full((1, 3), float(i), np.float32)}, {"y": out})
            for i, out in enumerate(outputs)]


def _run(table):
    """A candidate that answers each input (told apart by its value) from ``table``."""
    return lambda feed: {"y": table[int(feed["x"][0, 0])]}


def _compare(outputs, answers, require_task):
    adapter = _adapter()
    return compare(_run(answers), _cases(outputs), adapter=adapter, gates=Gates(adapter), precision="fp32",
                   require_task=require_task)


GRID = np.linspace(1.0, 640.0, 400, dtype=np.float32).reshape(1, 400)  # the anchor grid: the same for every input


def test_a_constant_reference_fails_a_gate_that_must_compare():
    """Whatever the candidate computes (here: every value doubled), a constant reference's statistics
    are not gated; the gate says it compared nothing and fails."""
    found = _compare([GRID, GRID.copy()], [GRID, GRID], require_task=True)
    assert not found.passed and found.status == "fail"
    assert found.constant == {"y": 0.0}
    (check,) = [c for c in found.checks if c.name.startswith("parity ")]
    assert check.name.startswith("parity y: nothing to compare") and not check.passed
    assert "constant" in found.parts_json()["y"]


def test_a_difference_from_a_constant_reference_still_fails():
    """A failed statistic shows a real difference; only the passes, which show nothing, are left out."""
    for require_task in (True, False):
        found = _compare([GRID, GRID.copy()], [GRID * 2, GRID * 2], require_task=require_task)
        assert not found.passed and "parity y rel_l2" in {c.name for c in found.checks if not c.passed}
        assert not [c for c in found.checks if c.passed]


def test_a_constant_reference_is_not_checked_where_the_task_is_optional():
    found = _compare([GRID, GRID.copy()], [GRID, GRID], require_task=False)
    assert found.passed and not found.checked and found.status == "not-checked"  # never "pass"
    assert not [c for c in found.checks if c.name.startswith("parity ")] and any("parity y not gated: nothing to compare" in n for n in found.notes)


def test_a_reference_that_depends_on_its_input_is_gated_and_can_fail():
    rng = np.random.default_rng(0)
    a, b = rng.random((1, 400), dtype=np.float32), rng.random((1, 400), dtype=np.float32)
    good = _compare([a, b], [a, b], require_task=True)
    assert good.passed and good.checked and good.status == "pass" and good.constant == {}
    swapped = _compare([a, b], [b, a], require_task=True)  # each input answered with the other's output
    assert not swapped.passed and any(c.name == "parity y rel_l2" for c in swapped.checks if not c.passed)


def test_variation_below_the_floor_counts_as_constant():
    """A random yolo12n's boxes differ by rel L2 7e-9 between two photographs: constant."""
    tiny = GRID * (1 + 1e-8)
    assert input_variation([GRID, tiny]) < VARIES
    found = _compare([GRID, tiny], [GRID, tiny], require_task=True)
    assert "y" in found.constant and not found.passed


@pytest.mark.parametrize("outputs", [[GRID], [GRID, GRID[:, :200]]])
def test_variation_is_not_judged_without_two_comparable_outputs(outputs):
    assert input_variation(outputs) is None
