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
    ("__init__", "cli", "__main__", "checks"),  # the package root's verbs import enginekit.api on first use
    ("api",),
    ("bench",),  # bench builds what it measures through flows
    ("flows", "runtime", "doctor", "serving"),
    ("verification",),
    ("recipes",),
    ("requests",),
    ("options",),  # each shared option declared once: what requests, recipes and the CLI make of it
    ("pipeline",),
    ("model",),
    ("stages",),
    ("backends",),
    ("families", "trt"),
    ("compare",),
    ("onnx",),
    ("cache",),
    ("store",),
    ("manifest",),
    ("shapes", "images", "datasets", "calibration", "errors", "reporting", "gpu", "fsutil", "precisions", "results",
     "engine_file", "hashing", "units", "_version", "latencies", "exact_resize", "lazy_kernels", "conv_epilogue"),
]
LEVEL = {name: depth for depth, names in enumerate(LEVELS) for name in names}

# Who may write to the terminal: the CLI and the reporting interface. checks/setup.py is the
# post-install check `make setup` runs as a script (python -m enginekit.checks.setup).
MAY_PRINT = ("cli", "reporting", "checks")

# Only trt/ imports TensorRT: directly, or through Polygraphy's TensorRT backend (which imports it).
TENSORRT = ("tensorrt", "tensorrt_rtx", "polygraphy.backend.trt", "polygraphy.backend.tensorrt_rtx")


def modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def component(path: Path) -> str:
    """``src/enginekit/flows/build.py`` -> ``flows``; ``src/enginekit/api.py`` -> ``api``."""
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def imported_components(path: Path) -> list[tuple[int, str, str]]:
    """(line, imported enginekit component, as written) for every import in ``path``: at the top, in a function,
    or for types only (``if TYPE_CHECKING``: a cycle closed for the type checker is a cycle)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(("enginekit", *path.relative_to(SRC).parent.parts))
    found = []
    for node in ast.walk(tree):
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
    unplaced = {component(p) for p in modules()} - set(LEVEL)
    assert not unplaced, f"place these in tests/test_layout.py LEVELS (and PLAN's order): {sorted(unplaced)}"


def test_imports_only_go_down():
    problems = []
    for path in modules():
        here = component(path)
        for line, target, name in imported_components(path):
            if target not in LEVEL:
                problems.append(f"{path.relative_to(SRC)}:{line}: imports {name}, which has no level")
            elif LEVEL[target] < LEVEL[here]:
                problems.append(f"{path.relative_to(SRC)}:{line}: {here} imports {name} from above it")
    assert not problems, "\n".join(problems)


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(("enginekit", *parts))


def import_cycles() -> list[list[str]]:
    """Groups of modules that import one another (Tarjan's strongly connected components of the module graph,
    every import counted: top, function-local, type-only)."""
    names = {module_name(p): p for p in modules()}
    graph: dict[str, set[str]] = {m: set() for m in names}
    for m, path in names.items():
        for _, _, name in imported_components(path):
            target = name
            while target not in names and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in names and target != m:
                graph[m].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_one_another():
    """Levels say which way imports go between components; within a component (and a level) no two modules may
    import each other either, directly or round a circle: the dependency graph is a tree a reader can follow."""
    cycles = import_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


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


def _tensorrt_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for each import of TensorRT, static or by ``importlib.import_module("...")``."""
    def is_trt(name: str) -> bool:
        return any(name == m or name.startswith(m + ".") for m in TENSORRT)

    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                                                      "__import__"):
            names = [a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        found += [(node.lineno, n) for n in dict.fromkeys(names) if is_trt(n)][:1]
    return found


def test_only_trt_imports_tensorrt():
    problems = []
    for path in modules():
        if component(path) == "trt":
            continue
        tree = ast.parse(path.read_text(), str(path))
        problems += [f"{path.relative_to(SRC)}:{line}: imports {name}" for line, name in _tensorrt_imports(tree)]
    assert not problems, "only enginekit.trt may import TensorRT:\n" + "\n".join(problems)


def test_the_runtime_only_loads():
    """runtime/ imports no flow (nor the API above them): exporting and building belong to the API layer."""
    problems = [f"{path.relative_to(SRC)}:{line}: imports {name}"
                for path in modules() if component(path) == "runtime"
                for line, target, name in imported_components(path) if target in ("flows", "api")]
    assert not problems, "\n".join(problems)


#: where a backend's name may be written other than its module and the registry, and what it names there
#: instead: "torch" the Python package, "tensorrt"/"tensorrt-rtx" TensorRT's own families (the build
#: backends of enginekit.trt's traits table) and distributions
NAME_ELSEWHERE: dict[str, set[str]] = {
    "trt": {"tensorrt", "tensorrt-rtx"},  # trt/: the TensorRT families themselves
    "requests/deploy.py": {"tensorrt"},  # deploy --platform tensorrt: Triton's TensorRT backend
    "recipes": {"tensorrt", "tensorrt-rtx"},  # a recipe's trt: (the TensorRT flavour that builds)
    "pipeline.py": {"torch", "tensorrt", "tensorrt-rtx"},  # distributions whose versions a manifest records
    "doctor.py": {"torch", "tensorrt", "tensorrt-rtx"},  # distributions; TensorRT families of the inventory
    "checks/setup.py": {"torch"},  # a module the setup check imports
    "runtime/predictor.py": {"torch"},  # the package a tensor comes from
    "store/identity.py": {"torch"},  # a distribution whose version the provenance line names
    # the distribution whose version keys a user's module or saved program (the adapter's framework)
    "families/torch_models/family.py": {"torch"},
    "families/torch_models/sources.py": {"torch"},
    # Triton's platforms (tensorrt_plan): what the server runs a network with, not enginekit's backends
    "serving": {"tensorrt"},
    "flows/deploy.py": {"tensorrt"},
}


def backend_names() -> set[str]:
    from enginekit.backends import names, variants

    return set(names()) | set(variants())


def name_literals(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) for every string constant in ``path`` that is exactly one of ``names``."""
    tree = ast.parse(path.read_text(), str(path))
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names)


def test_backend_names_live_in_their_modules_and_the_registry():
    """A backend is named once, in its module (and the registry); everything else asks the registry."""
    names = backend_names()
    problems = []
    for path in modules():
        rel = path.relative_to(SRC).as_posix()
        if component(path) == "backends":
            continue
        allowed = NAME_ELSEWHERE.get(rel, set()) | NAME_ELSEWHERE.get(component(path), set())
        problems += [f"{rel}:{line}: {name!r}" for line, name in name_literals(path, names) if name not in allowed]
    assert not problems, "name backends through enginekit.backends, not as literals:\n" + "\n".join(problems)


def test_the_checks_find_what_they_look_for(tmp_path):
    """The two walkers above see function-level imports, relative imports and prints."""
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from enginekit.cli import render\n    print('x')\n"
                      "    import sys\n    sys.stdout.write('y')\n")
    tree = ast.parse(sample.read_text())
    assert [w for _, w in _terminal_writes(tree)] == ["print()", "sys.stdout.write()"]
    trt_use = ast.parse("from polygraphy.backend import trt\nimport importlib\nimportlib.import_module('tensorrt_rtx')\n"
                        "from polygraphy.backend.common import BytesFromPath\n")
    assert _tensorrt_imports(trt_use) == [(1, "polygraphy.backend.trt"), (3, "tensorrt_rtx")]
    fake = SRC / "pipeline.py"
    assert ("pipeline", "reporting") in {("pipeline", t) for _, t, _ in imported_components(fake)}
    sample.write_text("A = 'onnxruntime-cpu'\nB = 'onnxruntime-cpu is fast'\nC = ('torch-fp16',)\n")
    assert name_literals(sample, backend_names()) == [(1, "onnxruntime-cpu"), (3, "torch-fp16")]


def _precision_lists(tree: ast.AST) -> list[tuple[int, str]]:
    """Tuple, list and set literals naming two or more precisions (``("fp32", "fp16")``, ``Literal[...]``)."""
    from enginekit.precisions import NAMES

    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            named = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in NAMES]
            if len(named) >= 2:
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_precisions_are_listed_only_in_their_registry():
    """A new precision is one line in enginekit/precisions.py: no other module keeps its own list of
    them (it would miss the new one); it asks the registry (``precisions.names(exported=True)``)."""
    problems = []
    for path in modules():
        if path.relative_to(SRC).as_posix() == "precisions.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        problems += [f"{path.relative_to(SRC)}:{line}: {text}" for line, text in _precision_lists(tree)]
    assert not problems, "ask enginekit.precisions instead of listing precisions:\n" + "\n".join(problems)
    sample = ast.parse('OK = ("fp32",)\nBAD = ["fp16", "int8"]\nP = Literal["fp32", "fp8"]\nif p in {"fp32", "fp16"}: pass\n')
    assert [line for line, _ in _precision_lists(sample)] == [2, 3, 4]


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


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    """import_cycles compares something: two modules importing each other (one inside a function) are found."""
    import sys

    here = sys.modules[__name__]
    pkg = tmp_path / "enginekit"
    (pkg / "flows").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "flows" / "__init__.py").write_text("")
    (pkg / "flows" / "a.py").write_text("from enginekit.flows.b import x\n")
    (pkg / "flows" / "b.py").write_text("def x():\n    from enginekit.flows import a\n")
    monkeypatch.setattr(here, "SRC", pkg)
    assert import_cycles() == [["enginekit.flows.a", "enginekit.flows.b"]]
