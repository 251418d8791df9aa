"""How often each level is written and how many versions it keeps; the Young/Daly interval."""

from __future__ import annotations

import math
from typing import Any

from .state import CheckpointError

__all__ = ["LEVELS", "parse_policy", "young_daly_interval"]

# fastest first: restore tries them in this order
LEVELS = ("memory", "local", "partner", "xor", "hdf5")
DEFAULT_EVERY = {"memory": 1, "local": 1, "partner": 1, "xor": 1, "hdf5": 1}
DEFAULT_KEEP = {"memory": 1, "local": 2, "partner": 2, "xor": 2, "hdf5": 2}


def check_levels(levels: Any) -> list[str]:
    """Level names in restore order.

    Raises:
        CheckpointError: an unknown or repeated name, or no level at all.
    """
    names = list(levels) if levels is not None else ["memory", "local"]
    unknown = [n for n in names if n not in LEVELS]
    if unknown:
        raise CheckpointError(f"unknown level(s) {unknown}; choose from {', '.join(LEVELS)}")
    if not names or len(set(names)) != len(names):
        raise CheckpointError(f"levels must be distinct and not empty, not {names}")
    return [n for n in LEVELS if n in names]


def parse_policy(
    policy: dict[str, Any] | None, names: list[str]
) -> tuple[dict[str, int], dict[str, int], int, bool]:
    """``{"every": {...}, "keep": {...}, "xor_group": k, "recycle": b}`` -> the four.

    ``every[L] = N`` writes level L on every N-th save (the first save writes every level);
    ``keep[L] = K`` keeps its newest K versions; ``xor_group`` is the number of nodes per
    XOR parity group (default 4); ``recycle`` (default True) keeps each pruned file of the
    node-local levels as a spare that the next version writes over instead of allocating
    new blocks (one spare per file name: a rank's storage holds K + 1 versions' worth).
    The HDF5 level always writes new files.

    Raises:
        CheckpointError: unknown entries, levels not in use, values that are not positive
            integers (the entry is named).
    """
    every = {n: DEFAULT_EVERY[n] for n in names}
    keep = {n: DEFAULT_KEEP[n] for n in names}
    group, recycle = 4, True
    for key, table in (policy or {}).items():
        if key == "recycle":
            if not isinstance(table, bool):
                raise CheckpointError(f"policy.recycle must be true or false, not {table!r}")
            recycle = table
            continue
        if key == "xor_group":
            if isinstance(table, bool) or not isinstance(table, int) or table < 2:
                raise CheckpointError(f"policy.xor_group must be an integer >= 2, not {table!r}")
            group = table
            continue
        if key not in ("every", "keep") or not isinstance(table, dict):
            raise CheckpointError(
                f"policy: unknown entry {key!r} "
                "(use 'every' and 'keep' tables, 'xor_group' and 'recycle')"
            )
        for level, value in table.items():
            if level not in names:
                raise CheckpointError(f"policy.{key}: {level!r} is not one of the levels {names}")
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CheckpointError(
                    f"policy.{key}.{level} must be a positive integer, not {value!r}"
                )
            (every if key == "every" else keep)[level] = value
    return every, keep, group, recycle


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
