"""How often each level is written and how many versions it keeps; the Young/Daly interval."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .levels import LEVELS
from .state import CheckpointError

__all__ = ["DEFAULT_LEVELS", "check_levels", "parse_policy", "Policy", "young_daly_interval"]

DEFAULT_LEVELS = ("memory", "local")


@dataclass
class Policy:
    """When each level is written, how many versions it keeps, and the levels' options.

    Attributes:
        every: Level -> write it on every N-th save (the first save writes every level).
        keep: Level -> keep its newest K versions.
        options: Each level's own entries (``xor_group``), defaults filled in.
        recycle: Keep pruned files as spares for the next versions to write over.
    """

    every: dict[str, int]
    keep: dict[str, int]
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    recycle: bool = True


def check_levels(levels: Any) -> list[str]:
    """Level names in restore order.

    Raises:
        CheckpointError: an unknown or repeated name, or no level at all.
    """
    names = list(levels) if levels is not None else list(DEFAULT_LEVELS)
    unknown = [n for n in names if n not in LEVELS]
    if unknown:
        raise CheckpointError(f"unknown level(s) {unknown}; choose from {', '.join(LEVELS)}")
    if not names or len(set(names)) != len(names):
        raise CheckpointError(f"levels must be distinct and not empty, not {names}")
    return [n for n in LEVELS if n in names]


def parse_policy(policy: dict[str, Any] | None, names: list[str]) -> Policy:
    """``{"every": {...}, "keep": {...}, "recycle": b, <level options>}`` -> a ``Policy``.

    ``every[L] = N`` writes level L on every N-th save (the first save writes every level);
    ``keep[L] = K`` keeps its newest K versions (defaults: each level's own);
    ``recycle`` (default True) keeps each pruned file of the node-local levels as a spare
    that the next version writes over instead of allocating new blocks (one spare per
    file name: a rank's storage holds K + 1 versions' worth); levels that cannot recycle
    (HDF5) always write new files. Any other entry is an option of a level in use, such
    as the XOR level's ``xor_group`` (nodes per XOR group, default 4).

    Raises:
        CheckpointError: unknown entries, levels not in use, values that are not positive
            integers (the entry is named).
    """
    classes = [LEVELS[n] for n in names]
    every = {cls.name: cls.default_every for cls in classes}
    keep = {cls.name: cls.default_keep for cls in classes}
    options = {cls.name: {k: default for k, (default, _) in cls.options.items()} for cls in classes}
    known = {key: cls for cls in LEVELS.values() for key in cls.options}  # any level's
    recycle = True
    for key, table in (policy or {}).items():
        if key == "recycle":
            if not isinstance(table, bool):
                raise CheckpointError(f"policy.recycle must be true or false, not {table!r}")
            recycle = table
            continue
        if key in known:
            problem = known[key].options[key][1](table)
            if problem:
                raise CheckpointError(f"policy.{key} {problem}, not {table!r}")
            if known[key].name in options:  # an option of a level not in use is ignored
                options[known[key].name][key] = table
            continue
        if key not in ("every", "keep") or not isinstance(table, dict):
            extra = "".join(f", {k!r}" for k in known)
            raise CheckpointError(
                f"policy: unknown entry {key!r} (use 'every' and 'keep' tables, 'recycle'{extra})"
            )
        for level, value in table.items():
            if level not in names:
                raise CheckpointError(f"policy.{key}: {level!r} is not one of the levels {names}")
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CheckpointError(
                    f"policy.{key}.{level} must be a positive integer, not {value!r}"
                )
            (every if key == "every" else keep)[level] = value
    return Policy(every, keep, options, recycle)


def young_daly_interval(cost_s: float, mtbf_s: float) -> float:
    """The compute time between checkpoints that minimises the expected waste.

    Daly's higher-order estimate (J. T. Daly, FGCS 2006) of the optimum, which reduces to
    Young's ``sqrt(2 * C * M)`` when the checkpoint cost C is small against the mean time
    between failures M; for ``C >= 2M`` it is M.

    Raises:
        CheckpointError: a cost or MTBF that is not a positive number.
    """
    for label, value in (("checkpoint cost", cost_s), ("MTBF", mtbf_s)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise CheckpointError(f"{label} must be a positive number of seconds, not {value!r}")
    if cost_s >= 2 * mtbf_s:
        return float(mtbf_s)
    ratio = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost_s
