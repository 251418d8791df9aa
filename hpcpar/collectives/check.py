"""``HPCPAR_CHECK=1``: check that every rank called a collective with the same arguments.

MPI leaves mismatched counts, types, ops or roots undefined: usually a hang or a
corrupted buffer far from the cause. The check costs one small allgather per call and
names the ranks that differ.
"""

from __future__ import annotations

from typing import Any

from ..layout import format_ranks
from ..runtime.env import getenv_fast
from ..runtime.settings import flag_of, raw_key
from .errors import CollectiveMismatchError

__all__ = ["checking", "check_same"]


_KEY = raw_key("HPCPAR_CHECK")


def checking() -> bool:
    """Whether ``HPCPAR_CHECK`` is on (read on every call, so it can be switched any time)."""
    return flag_of("HPCPAR_CHECK", getenv_fast("HPCPAR_CHECK", _KEY))


def check_same(comm: Any, collective: str, **fields: Any) -> None:
    """Raise on every rank if any field differs between ranks (collective over ``comm``).

    Raises:
        CollectiveMismatchError: naming the first differing field, its values and ranks.
    """
    every = comm.allgather(fields)
    for name in fields:
        groups: dict[str, list[int]] = {}
        for rank, seen in enumerate(every):
            groups.setdefault(repr(seen[name]), []).append(rank)
        if len(groups) > 1:
            detail = "; ".join(
                f"{value} on rank(s) {format_ranks(ranks)}" for value, ranks in groups.items()
            )
            raise CollectiveMismatchError(f"{collective}: ranks passed different {name}: {detail}")
