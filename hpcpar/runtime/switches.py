"""The hot path's switches and last-call state, as named attributes of one object.

The blocking calls read these on every call, so they live where one attribute lookup
finds them, and every module that reads or changes one names it the same way
(``HOT.guard``, ``HOT.recording``): a search for the name finds every use.
"""

from __future__ import annotations

from typing import Any

from . import settings

__all__ = ["HOT", "HotState"]


class HotState:
    """The switches the hot path reads, and what the last call left for the next.

    Attributes:
        guard: The mismatch guard checks the calls (off only to measure its cost, on
            every rank at the same call: ``collectives.guard.set_enabled``).
        recording: The flight record records calls (``HPCPAR_FLIGHT``;
            ``runtime.flight.set_enabled``).
        at: Flight-record entries made so far (the next goes to ``RING[at & mask]``).
        current: The flight-record entry of the last call this rank's own thread started.
        last_key: What the last flight-record entry was for (a run of identical calls
            is one entry).
        last_entry: That entry.
        last_call: The statistics of the last collective (``CollectiveStats``), or a
            library call's ``(collective, bytes)``.
        named: The name the next flight-record entry gives its call instead of hpcpar's
            (an intercepted mpi4py call: ``Allreduce``), or None; the entry takes it.
    """

    __slots__ = (
        "at",
        "current",
        "guard",
        "last_call",
        "last_entry",
        "last_key",
        "named",
        "recording",
    )

    def __init__(self) -> None:
        self.guard = True
        self.recording = settings.flag("HPCPAR_FLIGHT", strict=False)  # a typo: check says
        self.at = 0
        self.current: list[Any] | None = None
        self.last_key: Any = None
        self.last_entry: list[Any] | None = None
        self.last_call: Any = None
        self.named: str | None = None


HOT = HotState()
