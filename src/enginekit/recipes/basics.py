"""What every part of a recipe shares: how a check names its problem (the key path ``Loc`` and one message, as
pydantic errors of one type), and target sets (``targets:``, ``--target-cc``).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic_core import PydanticCustomError

from enginekit.trt.flavours import cc_tuple, normalize_cc


Loc = tuple[Union[str, int], ...]


class _Problem(Exception):
    def __init__(self, loc: Loc, message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message


_CHECK = "recipe_check"  # the pydantic error type of the checks above and in the schema's validators


def _problem(loc: Loc, message: str) -> PydanticCustomError:
    """A validator's error that names its own key: pydantic gives a field validator's error the
    field's location, but a check may point into it (``precisions[1]``) or at another key."""
    return PydanticCustomError(_CHECK, "{message}", {"message": message, "at": loc})


DEFAULT_TARGETS = "default"  # a target set meaning: this GPU, else the backend's portable set


def _target_text(item: Any) -> Any:
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        return str(item)
    if isinstance(item, list):
        return ",".join(str(x) for x in item)
    return item


def parse_target_set(text: str) -> Optional[tuple[str, ...]]:
    """``"8.9,8.6"`` -> ``("8.6", "8.9")``; ``"default"`` (or empty) -> None."""
    text = str(text).strip()
    if text in ("", DEFAULT_TARGETS):
        return None
    items = {normalize_cc(item) for item in text.split(",") if item.strip()}
    return tuple(sorted(items, key=cc_tuple))
