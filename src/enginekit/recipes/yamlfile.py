"""YAML with line numbers, and validation errors as one line naming the file, the line and the key.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ValidationError

from enginekit.errors import UsageError
from enginekit.recipes.basics import Loc, _CHECK
from enginekit.recipes.schema import Recipe


def _compose(text: str, file: str) -> tuple[Any, dict[Loc, int]]:
    """Parse YAML into Python values and a map from each key path to its line (1-based)."""
    if len(text) > MAX_RECIPE_CHARS:
        raise UsageError(f"{file}: {len(text)} characters; a recipe is at most {MAX_RECIPE_CHARS}")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_depth(node, file)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise UsageError(f"{file}:{line}: malformed YAML: {exc.problem or exc.context}") from exc
    except RecursionError as cause:  # the parser itself recurses per level: `[[[[...` ends here
        raise UsageError(f"{file}: nested too deeply (a recipe nests at most {MAX_RECIPE_DEPTH} levels)") from cause
    finally:
        loader.dispose()
    lines: dict[Loc, int] = {(): 1}
    if node is not None:
        _record_lines(node, (), lines, file)
    return data, lines


# A recipe is a few keys a few levels deep; anything far beyond is not a recipe.
MAX_RECIPE_CHARS = 1 << 20


MAX_RECIPE_DEPTH = 32


# Values once YAML aliases are expanded: a shipped recipe has about 60. Aliases let a few hundred
# bytes stand for billions of values (9 anchors of 9 aliases each: 9**9), which every later walk
# of the document (line numbers, validation) would expand.
MAX_RECIPE_VALUES = 10_000


def _check_depth(root: yaml.Node, file: str) -> None:
    """Refuse a document nested deeper than MAX_RECIPE_DEPTH, or holding more than
    MAX_RECIPE_VALUES values with its aliases expanded (iteratively: no recursion; the count
    stops the walk, so an alias bomb is refused in bounded time)."""
    stack = [(root, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_RECIPE_VALUES:
            raise UsageError(f"{file}: more than {MAX_RECIPE_VALUES} values once its aliases (*name) are expanded; "
                             "a recipe is a few dozen keys")
        if depth > MAX_RECIPE_DEPTH:
            raise UsageError(f"{file}:{node.start_mark.line + 1}: nested deeper than {MAX_RECIPE_DEPTH} levels")
        if isinstance(node, yaml.MappingNode):
            stack.extend((v, depth + 1) for _, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, depth + 1) for v in node.value)


def _record_lines(node: yaml.Node, path: Loc, lines: dict[Loc, int], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = path + (key_node.value,)
            if key in lines:  # YAML keeps the last of two equal keys: almost always a mistake
                raise UsageError(f"{file}:{key_node.start_mark.line + 1}: key '{_dotted(key)}' is given twice")
            lines[key] = key_node.start_mark.line + 1
            _record_lines(value_node, key, lines, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _record_lines(item, path + (i,), lines, file)


def _line_of(loc: Loc, lines: dict[Loc, int]) -> int:
    """The line of ``loc``, else of its nearest enclosing key."""
    for n in range(len(loc), -1, -1):
        if tuple(loc[:n]) in lines:
            return lines[tuple(loc[:n])]
    return 1


def _dotted(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _schema_levels(model: type[BaseModel] = Recipe, path: Loc = ()) -> dict[Loc, list[str]]:
    """Each mapping level of the schema ('*' for free keys) -> the keys it accepts."""
    levels = {path: list(model.model_fields)}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            annotation, sub = typing.get_args(annotation)[1], path + (name, "*")
        else:
            sub = path + (name,)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            levels.update(_schema_levels(annotation, sub))
    return levels


def _level_matches(pattern: Loc, loc: Loc) -> bool:
    return len(pattern) == len(loc) and all(p == "*" or p == x for p, x in zip(pattern, loc))


def _suggest(loc: Loc) -> Optional[str]:
    """A known key close to the unknown one at ``loc``: same level first, then anywhere."""
    parent, key = tuple(loc[:-1]), str(loc[-1])
    levels = _schema_levels()
    for pattern, keys in levels.items():
        if _level_matches(pattern, parent):
            close = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
            if close:
                return _dotted(parent + (close[0],))
    anywhere = {name: pattern + (name,) for pattern, keys in levels.items() for name in keys if "*" not in pattern}
    close = difflib.get_close_matches(key, list(anywhere), n=1, cutoff=0.75)
    return _dotted(anywhere[close[0]]) if close else None


def _error_loc(error: dict) -> Loc:
    """Where an error points: a check's own key, else pydantic's location."""
    if error["type"] == _CHECK:
        return tuple(error["ctx"]["at"])
    return tuple(error["loc"])


def _describe(error: dict) -> str:
    """One pydantic error -> 'key: what is wrong', in the recipe's words."""
    loc = tuple(p for p in _error_loc(error) if p != "[key]")
    kind = error["type"]
    if kind == _CHECK:
        return f"{_dotted(loc)}: {error['ctx']['message']}"
    if kind == "extra_forbidden":
        hint = _suggest(loc)
        return f"unknown key '{_dotted(loc)}'" + (f" (did you mean {hint}?)" if hint else "")
    if kind == "missing":
        return f"missing key '{_dotted(loc)}'"
    message = error["msg"][0].lower() + error["msg"][1:]
    if kind.startswith(("literal_error", "enum", "greater_than", "less_than")) or "[key]" in error["loc"]:
        message += f" (got {error['input']!r})"
    return f"{_dotted(loc)}: {message}"


def _validation_error(exc: ValidationError, file: str, lines: dict[Loc, int]) -> UsageError:
    """The first problem in file order, as one line naming file, line and key. Unknown keys
    come first: a typo'd key also makes its intended key look missing."""
    # Schema errors before checks: a check may only be failing because of a schema error elsewhere.
    errors = sorted(exc.errors(), key=lambda e: (e["type"] != "extra_forbidden", e["type"] == _CHECK,
                                                  _line_of(_error_loc(e), lines)))
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return UsageError(f"{file}:{_line_of(_error_loc(first), lines)}: {_describe(first)}{more}")
