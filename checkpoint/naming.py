"""How versions and their commit markers are named on disk, and which steps are valid.

A version's folder is ``v`` and its step with at least 12 digits (``v000000000042``):
names sort by step up to 10^12, and any step up to 2^64 - 1 still parses (steps counted
in samples or tokens reach 13 digits and more). Everything that names or parses a
version goes through here.
"""

from __future__ import annotations

import operator
import re

from .state import CheckpointError

__all__ = [
    "MAX_STEP",
    "check_step",
    "version_name",
    "parse_version",
    "marker_name",
    "parse_marker",
]

MAX_STEP = (1 << 64) - 1
_VERSION = re.compile(r"^v(\d{12,20})$")
_MARKER = re.compile(r"^v(\d{12,20})\.committed$")


def check_step(step: object) -> int:
    """``step`` as an int if it is a valid version number (0 .. 2^64 - 1).

    Python and numpy integers are accepted; booleans are not.

    Raises:
        CheckpointError: not an integer, negative or too large.
    """
    try:
        value = operator.index(step)  # type: ignore[call-overload]
    except TypeError:
        value = -1
    if isinstance(step, bool) or not 0 <= value <= MAX_STEP:
        raise CheckpointError(f"step must be an integer from 0 to 2^64 - 1, not {step!r}")
    return value


def version_name(step: int) -> str:
    """The folder name of version ``step``."""
    return f"v{step:012d}"


def parse_version(name: str) -> int | None:
    """The step of a version folder's name, or None if it is not one."""
    match = _VERSION.match(name)
    return _valid(match.group(1)) if match else None


def marker_name(step: int) -> str:
    """The file name of version ``step``'s commit marker."""
    return f"{version_name(step)}.committed"


def parse_marker(name: str) -> int | None:
    """The step of a commit marker's name, or None if it is not one."""
    match = _MARKER.match(name)
    return _valid(match.group(1)) if match else None


def _valid(digits: str) -> int | None:
    step = int(digits)
    return step if step <= MAX_STEP else None
