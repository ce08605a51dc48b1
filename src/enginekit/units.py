"""Sizes and ages as users write them on the command line: ``20G``, ``30d``."""

from __future__ import annotations

import re

from enginekit.errors import UsageError

# K, M, G, T (with or without B / iB) are binary units here, as du and docker read them; pydantic's
# ByteSize reads "G" as 10**9, so the unit is spelled out as "GiB" before it parses the text.
_SIZE_UNIT_RE = re.compile(r"(?<=[\d\s])([KMGT])(?:I?B)?$", re.IGNORECASE)
_AGE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$", re.IGNORECASE)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


_SIZE_SHAPE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?\s*([KMGT](I?B)?|B)?$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"20G"`` -> bytes. Suffixes K, M, G, T are powers of 1024; no suffix means bytes."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    spelled = _SIZE_UNIT_RE.sub(lambda m: m.group(1).upper() + "iB", str(text).strip())
    try:
        if not _SIZE_SHAPE_RE.match(str(text).strip()):  # ByteSize alone reads "1.5.2G" as 1
            raise ValueError
        return int(TypeAdapter(ByteSize).validate_python(spelled))
    except (ValidationError, ValueError) as cause:
        raise UsageError(
            f"malformed size {text!r}: expected a number with an optional K, M, G or T suffix, "
            "like 20G"
        ) from cause


def parse_age(text: str) -> float:
    """``"30d"`` -> seconds. Units: s, m, h, d, w (a unit is required: "30" is ambiguous)."""
    match = _AGE_RE.match(str(text).strip())
    if not match:
        raise UsageError(
            f"malformed age {text!r}: expected a number with a unit s, m, h, d or w, like 30d"
        )
    number, unit = match.groups()
    return float(number) * _AGE_UNITS[unit.lower()]
