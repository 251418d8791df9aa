"""Horovod's integer handles for the ``*_async`` collectives: ``poll`` and ``synchronize``."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from ...collectives.errors import CollectiveError
from ..basics import HorovodInternalError

__all__ = ["Pending", "new_handle", "take", "poll", "synchronize"]


class Pending:
    """A started collective: hpcpar's requests and what makes the result of them."""

    def __init__(self, requests: list[Any], finish: Callable[[], Any]) -> None:
        self.requests, self.finish = requests, finish


_HANDLES: dict[int, Pending] = {}
_NEXT = itertools.count(1)


def new_handle(requests: list[Any], finish: Callable[[], Any]) -> int:
    """A handle for the collective of ``requests`` whose result ``finish()`` makes."""
    handle = next(_NEXT)
    _HANDLES[handle] = Pending(requests, finish)
    return handle


def take(handle: int) -> Pending:
    """The started collective of ``handle``, no longer under it (for grouping)."""
    return _HANDLES.pop(handle)


def poll(handle: int) -> bool:
    """Whether the collective of ``handle`` is done (``synchronize`` then returns at once)."""
    pending = _HANDLES.get(handle)
    if pending is None:
        return True
    try:
        return all(r.test() for r in pending.requests)
    except CollectiveError as exc:
        raise HorovodInternalError(str(exc)) from None


def synchronize(handle: int) -> Any:
    """Wait for the collective of ``handle`` and return its output (None if unknown)."""
    pending = _HANDLES.pop(handle, None)
    if pending is None:
        return None
    try:
        for request in pending.requests:
            request.wait()
    except CollectiveError as exc:
        raise HorovodInternalError(str(exc)) from None
    return pending.finish()
