"""Finding and loading recipes: the shipped ones (package data) and the user's (``./recipes/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

from pydantic import ValidationError

from enginekit.errors import UsageError
from enginekit.fsutil import refuse_special_file
from enginekit.recipes.schema import RECIPE_SUFFIXES, Recipe
from enginekit.recipes.yamlfile import MAX_RECIPE_CHARS, _compose, _validation_error


@dataclass(frozen=True)
class RecipeRef:
    """A recipe file found on disk: shipped with enginekit, or local to the working directory."""

    name: str
    path: Path
    origin: str  # "shipped" | "local"


SHIPPED_PACKAGE_DIR = "shipped_recipes"  # package data of enginekit (pyproject's package-data)


def shipped_dir() -> Path:
    """The recipes installed with enginekit (``enginekit/shipped_recipes``), wheel or checkout alike.

    The checkout's top-level ``recipes/`` is a link to this folder, so ``recipes/yolo12n.yaml``
    names the same file in the Makefile, CI examples and error messages.
    """
    from importlib.resources import files

    return Path(str(files("enginekit").joinpath(SHIPPED_PACKAGE_DIR)))


def local_dir() -> Path:
    return Path.cwd() / "recipes"


def recipe_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in RECIPE_SUFFIXES and p.is_file())


def list_recipes() -> list[RecipeRef]:
    """Local recipes first, then shipped ones; a local recipe replaces the shipped one of its name
    (listed once, built once)."""
    refs: list[RecipeRef] = []
    seen: set[Path] = set()
    names: set[str] = set()
    for origin, folder in (("local", local_dir()), ("shipped", shipped_dir())):
        if folder.resolve() == shipped_dir().resolve():
            origin = "shipped"  # run from the checkout itself
        for path in recipe_files(folder):
            if path.resolve() not in seen and path.stem not in names:
                seen.add(path.resolve())
                names.add(path.stem)
                refs.append(RecipeRef(path.stem, path, origin))
    return refs


def find_recipe(name_or_path: str) -> Path:
    """A recipe file: a path as given, else a recipe name (local before shipped)."""
    path = Path(name_or_path)
    if path.suffix in RECIPE_SUFFIXES or path.exists():
        refuse_special_file(path, "recipe")
        if not path.is_file():
            raise UsageError(f"recipe {path} is a folder, not a file" if path.is_dir() else f"recipe file not found: {path}")
        return path
    for ref in list_recipes():
        if ref.name == name_or_path:
            return ref.path
    known = ", ".join(sorted({r.name for r in list_recipes()})) or "none"
    raise UsageError(f"unknown recipe {name_or_path!r}: give a .yaml path or one of: {known}")


def display_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it (as CI jobs need)."""
    import os

    cwd = Path.cwd()
    # Links are kept as given first: recipes/ in the checkout links to the package's folder.
    for absolute, base in ((Path(os.path.abspath(path)), Path(os.path.abspath(cwd))), (Path(path).resolve(), cwd.resolve())):
        try:
            return absolute.relative_to(base).as_posix()
        except ValueError:
            continue
    return str(path)


def load_recipe(name_or_path: Union[str, Path]) -> Recipe:
    """Read and fully validate a recipe; any problem is one UsageError naming file, line and key."""
    path = find_recipe(str(name_or_path))
    file = str(name_or_path) if Path(str(name_or_path)).suffix in RECIPE_SUFFIXES else display_path(path)
    try:
        from enginekit.fsutil import read_text

        text = read_text(path, limit=4 * MAX_RECIPE_CHARS, what="recipe")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read recipe {file}: {exc}") from exc
    data, lines = _compose(text, file)
    if not isinstance(data, dict):
        raise UsageError(f"{file}:1: a recipe is a mapping of keys (model, profiles, precisions, ...)")
    try:
        return Recipe.model_validate(data, context={"path": path})
    except ValidationError as exc:
        raise _validation_error(exc, file, lines) from exc


def collect_recipe_files(paths: list[str]) -> list[Path]:
    """Files and folders (their *.yaml) and names -> recipe files; none given: every known recipe."""
    if not paths:
        return [ref.path for ref in list_recipes()]
    files: list[Path] = []
    for item in paths:
        if Path(item).is_dir():
            found = recipe_files(Path(item))
            if not found:
                raise UsageError(f"{item} holds no recipe (*.yaml)")
            files.extend(found)
        else:
            files.append(find_recipe(item))
    unique: list[Path] = []
    for path in files:  # a file named twice (a folder and a file in it): once
        if all(path.resolve() != other.resolve() for other in unique):
            unique.append(path)
    by_name: dict[str, Path] = {}
    for path in unique:
        if path.stem in by_name:  # two recipes of one name would be two CI jobs of one name
            raise UsageError(f"two recipes are named {path.stem}: {display_path(by_name[path.stem])} and "
                             f"{display_path(path)}; a recipe's name is its file's, and names one job")
        by_name[path.stem] = path
    return unique
