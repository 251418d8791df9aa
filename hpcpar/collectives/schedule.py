"""Collectives as schedules: generators that yield the requests each step waits for.

An algorithm is a generator function. It posts nonblocking sends and receives, yields
the list of requests the next step depends on, and does its local work (reductions,
copies) when resumed. The blocking form runs the generator to the end, waiting on each
yielded list; the nonblocking form (``CollectiveRequest``) advances it only as far as
completed requests allow on each ``test()``, so the caller computes in between.
Sub-schedules compose with ``yield from`` (hierarchical algorithms) and run side by
side with ``concurrently`` (pipelining).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Generator
from typing import Any

from mpi4py import MPI

__all__ = ["Schedule", "run", "concurrently", "CollectiveRequest", "PendingRequestWarning"]

Schedule = Generator[list[MPI.Request], None, Any]


class PendingRequestWarning(RuntimeWarning):
    """A nonblocking collective was dropped before it completed."""


def run(schedule: Schedule) -> Any:
    """Run a schedule to completion, blocking; return its return value."""
    try:
        while True:
            requests = next(schedule)
            if requests:
                MPI.Request.Waitall(requests)
    except StopIteration as stop:
        return stop.value


def concurrently(*schedules: Schedule) -> Schedule:
    """Run schedules side by side: each step waits for the union of their pending requests.

    The schedules must not depend on each other's messages within one step, and must
    use different tags where they share a communicator.
    """
    live = list(schedules)
    pending: list[list[MPI.Request]] = [[] for _ in live]
    while live:
        for i, sched in enumerate(live):
            if sched is None:
                continue
            try:
                pending[i] = next(sched)
            except StopIteration:
                live[i] = None  # type: ignore[call-overload]
                pending[i] = []
        if all(s is None for s in live):
            return
        yield [r for reqs in pending for r in reqs]


def _caller() -> str:
    """Where user code started the collective: the first frame outside this package."""
    frame = sys._getframe(1)
    here = os.path.dirname(__file__)
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == here:
        frame = frame.f_back
    if frame is None:
        return "unknown"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class CollectiveRequest:
    """The handle a nonblocking collective returns.

    ``test()`` advances the schedule as far as completed messages allow and says
    whether it has finished; ``wait()`` finishes it and returns the result (the output
    array). A request dropped unfinished is reported with a ``PendingRequestWarning``
    naming where it was started.
    """

    def __init__(self, name: str, schedule: Schedule, finish: Callable[[Any], Any]) -> None:
        self.name = name
        self._schedule: Schedule | None = schedule
        self._finish = finish
        self._waiting: list[MPI.Request] = []
        self._result: Any = None
        self._done = False
        self._origin = _caller()
        self._advance()

    def _advance(self) -> bool:
        while not self._done:
            if self._waiting and not MPI.Request.Testall(self._waiting):
                return False
            try:
                self._waiting = next(self._schedule) or []  # type: ignore[arg-type]
            except StopIteration as stop:
                self._schedule = None
                self._done = True
                self._result = self._finish(stop.value)
        return True

    def test(self) -> bool:
        """Make progress; return True once the collective has completed."""
        return self._advance()

    def wait(self) -> Any:
        """Block until the collective completes; return its result."""
        while not self._done:
            if self._waiting:
                MPI.Request.Waitall(self._waiting)
            self._advance()
        return self._result

    @property
    def done(self) -> bool:
        """Whether the collective has completed (without making progress)."""
        return self._done

    def __del__(self) -> None:
        if not getattr(self, "_done", True):
            warnings.warn(
                f"hpcpar: {self.name} request dropped before completion; call wait() on it. "
                f"Started at {self._origin}",
                PendingRequestWarning,
                stacklevel=2,
            )
