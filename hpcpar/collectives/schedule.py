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

from ..runtime.orphans import adopt, progress_adopted
from ..runtime.switches import HOT
from .errors import explain_mpi_error

__all__ = ["Schedule", "run", "concurrently", "CollectiveRequest", "PendingRequestWarning"]

Schedule = Generator[list[MPI.Request], None, Any]


class PendingRequestWarning(RuntimeWarning):
    """A nonblocking collective was dropped before it completed."""


def run(schedule: Schedule, collective: str = "collective") -> Any:
    """Run a schedule to completion, blocking; return its return value.

    Raises:
        CollectiveMismatchError: a message did not fit (ranks passed different counts).
    """
    try:
        while True:
            requests = next(schedule)
            if requests:
                MPI.Request.Waitall(requests)
    except StopIteration as stop:
        return stop.value
    except MPI.Exception as exc:
        raise explain_mpi_error(exc, collective) from None


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


class _Operation:
    """A running schedule: what a request drives, and what stays alive if it is dropped."""

    __slots__ = ("done", "finish", "name", "origin", "result", "schedule", "waiting")

    def __init__(self, name: str, schedule: Schedule, finish: Callable[[Any], Any]) -> None:
        self.name = name
        self.schedule: Schedule | None = schedule
        self.finish = finish
        self.waiting: list[MPI.Request] = []
        self.result: Any = None
        self.done = False
        self.origin = _caller()

    def progress(self) -> bool:
        """Advance as far as completed messages allow; True once the schedule has ended."""
        while not self.done:
            if self.waiting and not MPI.Request.Testall(self.waiting):
                return False
            try:
                self.waiting = next(self.schedule) or []  # type: ignore[arg-type]
            except StopIteration as stop:
                self.schedule = None
                self.waiting = []
                self.done = True
                self.result = self.finish(stop.value)
        return True

    def wait(self) -> Any:
        entry = getattr(self.finish, "flight", None)
        if entry is not None:
            HOT.current = entry  # this rank now waits in it
        try:
            while not self.done:
                if self.waiting:
                    MPI.Request.Waitall(self.waiting)
                self.progress()
        except MPI.Exception as exc:
            raise explain_mpi_error(exc, self.name) from None
        return self.result

    def describe(self) -> str:
        return f"{self.name} started at {self.origin}"


class CollectiveRequest:
    """The handle a nonblocking collective returns.

    ``test()`` advances the schedule as far as completed messages allow and says
    whether it has finished; ``wait()`` finishes it and returns the result (the output
    array). A request dropped unfinished is reported with a ``PendingRequestWarning``
    naming where it was started, and its operation is completed in the background
    (``hpcpar.runtime.orphans``): its buffers stay alive until MPI is done with them.
    """

    def __init__(self, name: str, schedule: Schedule, finish: Callable[[Any], Any]) -> None:
        self._op = _Operation(name, schedule, finish)
        progress_adopted()
        self._op.progress()

    @property
    def name(self) -> str:
        """The nonblocking collective's name (``iallreduce`` ...)."""
        return self._op.name

    def test(self) -> bool:
        """Make progress; return True once the collective has completed."""
        progress_adopted()
        return self._op.progress()

    def wait(self) -> Any:
        """Block until the collective completes; return its result."""
        progress_adopted()
        return self._op.wait()

    @property
    def done(self) -> bool:
        """Whether the collective has completed (without making progress)."""
        return self._op.done

    def __del__(self) -> None:
        op = getattr(self, "_op", None)
        if op is None or op.done:
            return
        adopt(op)
        warnings.warn(
            f"hpcpar: {op.name} request dropped before completion; call wait() on it. "
            f"Started at {op.origin}. hpcpar completes it in the background",
            PendingRequestWarning,
            stacklevel=2,
        )
