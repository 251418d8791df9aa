"""Collective assertions: check a condition on every rank and name the ranks that fail."""

from __future__ import annotations

from typing import Any

import numpy as np

from .layout import format_ranks
from .runtime.comm import resolve_comm

__all__ = [
    "failing_ranks",
    "assert_all",
    "assert_allclose_all",
    "assert_equal_all",
    "layouts_for",
]


def failing_ranks(ok: bool, comm: Any = None) -> list[int]:
    """Return the ranks of ``comm`` where ``ok`` is false (collective)."""
    flags = resolve_comm(comm).allgather(bool(ok))
    return [r for r, flag in enumerate(flags) if not flag]


def assert_all(ok: bool, message: str = "condition failed", comm: Any = None) -> None:
    """Raise ``AssertionError`` on every rank if ``ok`` is false on any rank (collective).

    The message names the failing ranks, so all ranks fail the same test together
    instead of one failing while the others block in the next collective.
    """
    bad = failing_ranks(ok, comm)
    if bad:
        size = resolve_comm(comm).Get_size()
        raise AssertionError(f"{message} (failed on rank(s) {format_ranks(bad)} of {size})")


def _compare(check: Any, actual: Any, desired: Any, **kwargs: Any) -> tuple[bool, str]:
    try:
        check(actual, desired, **kwargs)
    except AssertionError as exc:
        return False, str(exc).strip().splitlines()[-1] if str(exc).strip() else "mismatch"
    return True, ""


def _assert_compared(check: Any, actual: Any, desired: Any, comm: Any, **kwargs: Any) -> None:
    _, detail = _compare(check, actual, desired, **kwargs)
    details = resolve_comm(comm).allgather(detail)
    bad = [r for r, d in enumerate(details) if d]
    if bad:
        size = resolve_comm(comm).Get_size()
        raise AssertionError(
            f"arrays differ on rank(s) {format_ranks(bad)} of {size}; "
            f"rank {bad[0]}: {details[bad[0]]}"
        )


def assert_allclose_all(actual: Any, desired: Any, comm: Any = None, **kwargs: Any) -> None:
    """``numpy.testing.assert_allclose`` on every rank, failing on all if any differs."""
    _assert_compared(np.testing.assert_allclose, actual, desired, comm, **kwargs)


def assert_equal_all(actual: Any, desired: Any, comm: Any = None) -> None:
    """``numpy.testing.assert_array_equal`` on every rank, failing on all if any differs."""
    _assert_compared(np.testing.assert_array_equal, actual, desired, comm)


def layouts_for(size: int) -> list[str | None]:
    """Virtual layouts worth testing at ``size`` ranks: even, uneven, round-robin, real.

    ``None`` stands for the real nodes. Every layout returned fits ``size``.
    """
    layouts: list[str | None] = [None, "ppn:1", "ppn:2", "ppn:3"]
    if size >= 2:
        layouts += ["roundrobin:2", f"nodes:1,{size - 1}", f"nodes:{size - 1},1"]
    if size >= 3:
        layouts += ["roundrobin:3", f"nodes:2,{','.join(['1'] * (size - 2))}"]
    return list(dict.fromkeys(layouts))
