"""The docs a newcomer reads: a README that fits a screen, help that reads at 80 columns, a command reference that
is what the commands say, and links that lead somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERBS = ("export", "simplify", "build", "verify", "predict", "tune", "bench", "doctor", "models", "matrix")


def test_the_command_reference_is_what_the_commands_say():
    """docs/cli.md is written by ``python -m enginekit.cli.reference``: regenerate it after changing an option."""
    from enginekit.cli.reference import reference

    assert (ROOT / "docs" / "cli.md").read_text() == reference(), \
        "docs/cli.md is out of date: python -m enginekit.cli.reference > docs/cli.md"


def test_the_readme_fits_one_screen_and_its_links_lead_somewhere():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 40, len(text.splitlines())
    assert "make run" in text and "make test" in text and "best.pt" in text and ".onnx" in text
    for doc in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def _help(verb: str) -> str:
    env = dict(os.environ, COLUMNS="80", TERMINAL_WIDTH="80")
    done = subprocess.run([sys.executable, "-m", "enginekit", *verb.split(), "--help"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("verb", [*VERBS, "cache ls", "cache gc", "cache push", "recipes show"])
def test_help_reads_at_80_columns(verb):
    """No option name cut short, no example broken inside a command, one short line of help per option."""
    text = _help(verb)
    assert "…" not in text, [line for line in text.splitlines() if "…" in line]
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    for i, line in enumerate(lines):
        if line.strip().startswith("enginekit "):  # an example: whole on its line
            following = lines[i + 1].strip() if i + 1 < len(lines) else ""
            assert not following or following.startswith(("enginekit", "╭", "Example")), (line, following)
    if verb == "verify":
        assert len(lines) <= 120, len(lines)
