"""The code's shape: imports only go down the pipeline, and the library never prints.

Both are read from the source with ``ast`` (every import, also those inside functions), so a
newcomer's module that breaks either rule fails here with its file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "enginekit"

# Top to bottom: a module may import from its own level or any level below it.
LEVELS: list[tuple[str, ...]] = [
    ("cli", "__main__", "checks"),
    ("api",),
    ("flows", "runtime", "bench", "doctor"),
    ("verification",),
    ("recipes",),
    ("requests",),
    ("pipeline",),
    ("stages",),
    ("families", "trt"),
    ("compare",),
    ("onnx",),
    ("cache", "shapes", "images", "calibration", "errors", "reporting", "gpu", "fsutil", "results", "__version__"),
]
LEVEL = {name: depth for depth, names in enumerate(LEVELS) for name in names}

# Upward imports being removed on their own branch: compare/ takes its Tolerance and family
# protocol from compare/ itself. Delete a line here once its fix has landed.
PENDING: set[tuple[str, str]] = set()  # (module, level) pairs excused while a move is under way

# Who may write to the terminal: the CLI and the reporting interface. checks/setup.py is the
# post-install check `make setup` runs as a script (python -m enginekit.checks.setup).
MAY_PRINT = ("cli", "reporting", "checks")


def modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def component(path: Path) -> str:
    """``src/enginekit/flows/build.py`` -> ``flows``; ``src/enginekit/api.py`` -> ``api``."""
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imported_components(path: Path) -> list[tuple[int, str, str]]:
    """(line, imported enginekit component, as written) for every runtime import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_lines(tree)
    package = ".".join(("enginekit", *path.relative_to(SRC).parent.parts))
    found = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "enginekit" or len(parts) < 2:
                continue
            found.append((node.lineno, parts[1], name))
    return found


def test_every_module_has_a_level():
    unplaced = {component(p) for p in modules() if component(p) != "__init__"} - set(LEVEL)
    assert not unplaced, f"place these in tests/test_layout.py LEVELS (and PLAN's order): {sorted(unplaced)}"


def test_imports_only_go_down():
    problems = []
    for path in modules():
        here = component(path)
        if here == "__init__":  # the package root: its API functions import enginekit.api on call
            continue
        for line, target, name in imported_components(path):
            if target not in LEVEL:
                problems.append(f"{path.relative_to(SRC)}:{line}: imports {name}, which has no level")
            elif LEVEL[target] < LEVEL[here] and (path.relative_to(SRC).as_posix(), target) not in PENDING:
                problems.append(f"{path.relative_to(SRC)}:{line}: {here} imports {name} from above it")
    assert not problems, "\n".join(problems)


def _terminal_writes(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            text = ast.unparse(node.func)
            if text == "print" or text.endswith(("stdout.write", "stderr.write")):
                found.append((node.lineno, text + "()"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith("rich.console")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("rich.console") or (node.module == "rich" and
                                                           any(a.name in ("print", "console") for a in node.names)):
                found.append((node.lineno, f"from {node.module} import ..."))
    return found


def test_the_library_never_prints():
    problems = []
    for path in modules():
        if component(path) in MAY_PRINT:
            continue
        tree = ast.parse(path.read_text(), str(path))
        problems += [f"{path.relative_to(SRC)}:{line}: {what}" for line, what in _terminal_writes(tree)]
    assert not problems, "report through enginekit.reporting instead:\n" + "\n".join(problems)


def test_the_checks_find_what_they_look_for(tmp_path):
    """The two walkers above see function-level imports, relative imports and prints."""
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from enginekit.cli import render\n    print('x')\n"
                      "    import sys\n    sys.stdout.write('y')\n")
    tree = ast.parse(sample.read_text())
    assert [w for _, w in _terminal_writes(tree)] == ["print()", "sys.stdout.write()"]
    fake = SRC / "pipeline.py"
    assert ("pipeline", "reporting") in {("pipeline", t) for _, t, _ in imported_components(fake)}


def _family_names() -> set[str]:
    from enginekit.families import registered

    return {cls.family for cls in registered()}


def _family_branches(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Comparisons of a family (``x.family``, a variable ``family``) with a registered family's name:
    ``adapter.family == "yolo"``, ``family in ("yolo", "rtdetr")``, ``"yolo" != cls.family``."""
    found = []

    def is_family(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "family") or (
            isinstance(node, ast.Name) and node.id == "family")

    def literals(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_family(s) for s in sides) and any(literals(s) & names for s in sides if not is_family(s)):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_nothing_outside_families_branches_on_a_family_name():
    """What differs between families is declared by them (``families.interface``) and asked for: a comparison
    with a family's name outside ``families/`` is a branch a new family would have to be added to."""
    names = _family_names()
    problems = []
    for path in modules():
        if component(path) == "families":
            continue
        tree = ast.parse(path.read_text(), str(path))
        problems += [f"{path.relative_to(SRC)}:{line}: {text}" for line, text in _family_branches(tree, names)]
    assert not problems, "declare what differs on the family instead:\n" + "\n".join(problems)


def test_the_family_branch_check_finds_branches():
    names = {"yolo", "rtdetr"}
    code = ("if adapter.family == 'yolo': pass\nif family in ('rtdetr', 'x'): pass\nok = 'yolo' != cls.family\n"
            "if family == 'tensorrt': pass\nif adapter.task == 'yolo': pass\n")
    assert [line for line, _ in _family_branches(ast.parse(code), names)] == [1, 2, 3]


@pytest.mark.parametrize("name", ["export", "build", "verify"])
def test_api_names_cannot_be_shadowed(name):
    """``enginekit.verify`` stays the function after every subpackage has been imported."""
    import importlib
    import inspect

    import enginekit

    for path in modules():
        rel = path.relative_to(SRC).with_suffix("")
        if rel.parts[0] in ("__main__", "checks") or rel.name == "__main__":
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if parts and parts[0] in ("api", "flows", "requests", "reporting", "recipes", "verification", "compare"):
            importlib.import_module(".".join(("enginekit", *parts)))
    assert inspect.isfunction(getattr(enginekit, name))


def test_importing_enginekit_is_cheap():
    import subprocess
    import sys

    code = ("import sys, enginekit, enginekit.api, enginekit.requests, enginekit.reporting; "
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'tensorrt', 'tensorrt_rtx', 'ultralytics', "
            "'modelopt', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
