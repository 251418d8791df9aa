"""Every rank of a communicator runs its collectives under the same settings.

Each rank decides which algorithm a collective runs from its own environment (the
settings marked ``agree`` in ``runtime/settings.py``: ``HPCPAR_ALGORITHM_<COLLECTIVE>``,
``HPCPAR_RULES``, ``HPCPAR_PROFILE``, ``HPCPAR_AUTOTUNE``, ``HPCPAR_SEGMENT_BYTES``,
``HPCPAR_CHECK``, ``HPCPAR_LAYOUT``).
Ranks started with different values would run different algorithms: a hang, or wrong
results with exit status 0. So the first time hpcpar uses a communicator (a collective
step every rank takes anyway) the ranks compare these settings, the contents of the
rules and profile files and their hpcpar version, and a difference raises
``CollectiveMismatchError`` on every rank naming the setting and the ranks. The calls
themselves carry nothing extra; per-call arguments (counts, dtypes, ops, roots) are
compared by ``HPCPAR_CHECK=1`` (``check.py``).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from .._version import __version__
from ..layout import format_ranks
from ..runtime.settings import TABLE
from .errors import CollectiveMismatchError
from .names import COLLECTIVES

__all__ = ["SETTINGS", "FILE_SETTINGS", "settings", "agree"]

# the settings table's entries the ranks must agree on (a family: one per collective)
SETTINGS = tuple(
    member
    for entry in TABLE
    if entry.agree
    for member in (
        [f"{entry.name}{name.upper()}" for name in COLLECTIVES]
        if entry.name.endswith("_")
        else [entry.name]
    )
)
FILE_SETTINGS = tuple(e.name for e in TABLE if e.agree and e.kind == "path")  # by content


def settings() -> dict[str, str]:
    """This rank's values of ``SETTINGS`` (files by content digest) and hpcpar version."""
    out = {"hpcpar version": __version__}
    for name in SETTINGS:
        value = os.environ.get(name)
        if value is None:
            out[name] = "unset"
        elif name in FILE_SETTINGS:
            out[name] = _content(value)
        else:
            out[name] = repr(value)
    return out


def _content(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f"a file with content {hashlib.blake2b(f.read(), digest_size=8).hexdigest()}"
    except OSError:
        return f"{path!r} (unreadable)"


def agree(comm: Any) -> None:
    """Raise on every rank of ``comm`` unless all of them run with the same ``settings()``.

    Collective (one allgather of a few short strings).

    Raises:
        CollectiveMismatchError: naming the first setting that differs, its values and
            the ranks holding each.
    """
    every = comm.allgather(settings())
    for name in every[0]:
        groups: dict[str, list[int]] = {}
        for rank, seen in enumerate(every):
            groups.setdefault(seen.get(name, "unset"), []).append(rank)
        if len(groups) > 1:
            detail = "; ".join(
                f"{value} on rank(s) {format_ranks(ranks)}" for value, ranks in groups.items()
            )
            raise CollectiveMismatchError(
                f"ranks run with different {name}: {detail} (every rank must see the same "
                "value, or each would choose its own algorithm)"
            )
