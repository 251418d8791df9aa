"""Sizes in bytes as people write them: ``8``, ``64KiB``, ``1M``, ``2GiB``."""

from __future__ import annotations

import re

from ..errors import UsageError

__all__ = ["parse_size", "format_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 1 << 30,
}


def parse_size(text: str) -> int:
    """Parse ``"8"``, ``"64KiB"``, ``"1M"``, ``"2GiB"`` into bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UsageError(
            f"bad size {text!r}: expected a number with an optional unit (B, KiB, MiB, GiB)"
        )
    return int(match.group(1)) * _UNITS[unit]


def format_size(nbytes: int) -> str:
    """Format bytes with the largest binary unit that divides them."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return f"{nbytes}B"
