"""Recipe runs: build or verify every (precision, target set) of a recipe, and the CI matrix.

Every cell's request is made before the first build, so a bad one stops all work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from enginekit.recipes import Recipe, collect_recipe_files, display_path, load_recipe
from enginekit.flows import run
from enginekit.flows.build import run_build
from enginekit.flows.verify import run_verify


def build_recipe(path: Union[str, Path, Recipe], overrides: Optional[dict] = None, *, cache=None,
                 quiet: bool = False) -> list:
    """Build every cell of a recipe (``overrides``: BuildRequest names that win over the file).
    Returns one ``BuildOutcome`` per cell; cached cells cost nothing."""
    return [outcome for _, outcome in iter_build_recipe(path, overrides, cache=cache, quiet=quiet)]


def iter_build_recipe(path: Union[str, Path, Recipe], overrides: Optional[dict] = None, *, cache=None,
                      quiet: bool = False, on_cell=None):
    """Like ``build_recipe``, yielding ``(cell, outcome)`` as each engine is ready.

    ``on_cell(recipe, cell, index, total)`` is called before each cell (progress display).
    """
    recipe = path if isinstance(path, Recipe) else load_recipe(path)
    jobs = [(cell, recipe.build_request(cell, overrides)) for cell in recipe.cells(overrides)]
    for i, (cell, request) in enumerate(jobs, 1):
        if on_cell is not None:
            on_cell(recipe, cell, i, len(jobs))
        yield cell, run(run_build, request, cache, quiet=quiet)


def verify_recipe(path: Union[str, Path, Recipe], overrides: Optional[dict] = None, *,
                  report_dir: Optional[Path] = None, junit: Optional[Path] = None, cache=None,
                  quiet: bool = False) -> list:
    """Verify every cell of a recipe (the verify flow once per cell); one ``VerifyOutcome`` each.

    With several cells, each writes its reports under ``report_dir/<precision>-<targets>/``
    and its JUnit file next to ``junit`` with the same suffix, so none overwrites another.
    """
    recipe = path if isinstance(path, Recipe) else load_recipe(path)
    cells = recipe.cells(overrides)
    requests = []
    for cell in cells:
        label = f"{cell.precision}-{cell.targets_label}"
        own_report = Path(report_dir) / label if report_dir and len(cells) > 1 else report_dir
        own_junit = Path(junit).with_stem(f"{Path(junit).stem}-{label}") if junit and len(cells) > 1 else junit
        requests.append(recipe.verify_request(cell, overrides).replace(report_dir=own_report, junit=own_junit))
    return [run(run_verify, request, cache, quiet=quiet) for request in requests]


def matrix_jobs(paths: list[str]) -> list[dict[str, str]]:
    """One CI job per (recipe, precision, target set), for every recipe (validated first)."""
    jobs = []
    for path in collect_recipe_files(paths):
        recipe = load_recipe(path)
        for cell in recipe.cells():
            jobs.append({"recipe": display_path(path), "name": recipe.name, "precision": cell.precision,
                         "targets": cell.targets_label})
    return jobs
