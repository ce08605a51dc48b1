"""`make bench-pipeline` runs benchmarks/pipeline.py: its quick mode runs here, so the script cannot break unseen.

Figures are not asserted (a benchmark's output is quoted, never a timed test); what is asserted is that each
section measures what it says: the rows exist with finite values, the graphs written from a calibration cache
are the calibrated one, and verify's rows carry verify's verdict, not an assumed pass.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "pipeline.py"


def bench(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_quick_run_reports_every_section(tmp_path):
    """help, cold and int8 in their quick configuration (verify's rows: the test below, on a run that fails fast)."""
    out = tmp_path / "bench.json"
    done = bench("--quick", "--section", "help,cold,int8", "--json", str(out), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    by_section: dict[str, list[dict]] = {}
    for row in rows:
        by_section.setdefault(row["section"], []).append(row)
        assert math.isfinite(row["value"]) and row["value"] >= 0, row
    assert set(by_section) == {"help", "cold", "int8"}

    cold = {row["what"]: row for row in by_section["cold"]}
    assert any("fp16 stage" in what and row["value"] > 0 for what, row in cold.items())
    assert any("export --fp16 wall" in what and "cpu " in row["note"] for what, row in cold.items())

    int8 = by_section["int8"]
    assert any("calibrating" in row["what"] for row in int8)
    assert any("from calibration cache" in row["what"] for row in int8)
    # the Q/DQ layout the calibrating run kept served a hit (the script fails when that hit ran ModelOpt)
    assert any("Q/DQ layout kept, no ModelOpt" in row["what"] and "speed-up" in row["what"] for row in int8)
    assert any("speed-up" in row["what"] and row["value"] > 0 and "in cpu seconds" in row["note"] for row in int8)
    assert all("cpu " in row["note"] for row in int8 if "calibrating," in row["what"] or "from calibration" in row["what"])
    (same,) = [row for row in int8 if "equal the calibrated one" in row["what"]]
    assert same["value"] == 1.0, same
    assert "Traceback" not in done.stderr


def load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_pipeline_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script  # dataclasses look their module up there
    spec.loader.exec_module(script)
    return script


def test_verify_rows_carry_verify_verdict_not_a_pass(tmp_path):
    """The verify section reports the verdict verify's exit code gives, with its error line: a real run
    of verify that fails (a file that does not exist) is reported as bad input, not as a time that passed."""
    script = load_script()
    ran = script.run([*script.ENGINEKIT, "verify", str(tmp_path / "missing.onnx")],
                     {"PYTHONPATH": str(ROOT / "src"), "ENGINEKIT_CACHE": str(tmp_path / "c")})
    assert ran.returncode == 2, ran
    note = script.verdict(ran)
    assert note.startswith("exit 2 (bad input: error: "), note
    assert "missing.onnx" in note, note
    assert script.verdict(script.Ran(1.0, 0, "")) == "exit 0 (pass)"
    assert script.verdict(script.Ran(1.0, -9, "")).startswith("exit -9 (crashed")


def test_bad_section_is_one_error_line(tmp_path):
    done = bench("--section", "help,nonsense", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: unknown section 'nonsense': choose from "
                                                "help, cold, export, ort, build, int8, verify, hits"]


def test_unknown_model_is_one_error_line(tmp_path):
    done = bench("--section", "int8", "--models", "depth,nonsense", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: unknown model 'nonsense': choose from depth, yolo12n"]


def test_a_failing_step_is_one_error_line_not_a_traceback(tmp_path):
    """A step the benchmark needs (here: exporting a model that does not exist) ends the run in one line, exit 1."""
    script = load_script()
    with pytest.raises(script.BenchError, match=r"exited 2: error: "):
        script.wall([*script.ENGINEKIT, "export", "no-such-model", "--random-init"],
                    {"PYTHONPATH": str(ROOT / "src"), "ENGINEKIT_CACHE": str(tmp_path / "c")})
