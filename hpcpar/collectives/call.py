"""One collective call: its channels on every level, its counters, its state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .channel import Channel, CollectiveStats
from .schedule import Schedule
from .state import CommState

__all__ = ["Call", "open_call", "on_flat"]


class Call:
    """Everything an algorithm needs for one call; channels are made on first use.

    Attributes:
        state: The communicator's cached state (hierarchy, node lists).
        stats: This call's counters.
        tag: The call's base tag.
        blocking: Whether the call runs to completion at once (the ``mpi`` algorithm
            then uses the library's blocking collective, which MPI libraries tune
            better than the nonblocking one).
        flight: The call's entry in the flight record (None while it is off).
        guard: What the call added to the mismatch guard's sum (signature, number),
            None while the guard is off.
    """

    def __init__(self, state: CommState, stats: CollectiveStats, tag: int, blocking: bool) -> None:
        self.state = state
        self.stats = stats
        self.tag = tag
        self.blocking = blocking
        self.flight: Any = None  # the call's flight-record entry (hpcpar.runtime.flight)
        self.guard: tuple[int, int] | None = None
        self._channels: dict[str, Channel | None] | None = None

    def _channel(self, level: str) -> Channel | None:
        if self._channels is None:
            self._channels = self.state.channels(self.tag, self.stats)
        return self._channels[level]

    @property
    def flat(self) -> Channel:
        """All ranks."""
        return self._channel("flat")  # type: ignore[return-value]

    @property
    def node(self) -> Channel:
        """The ranks of this rank's node."""
        return self._channel("node")  # type: ignore[return-value]

    @property
    def leaders(self) -> Channel | None:
        """One rank per node (None on non-leaders)."""
        return self._channel("leaders")

    @property
    def rail(self) -> Channel:
        """The ranks with this rank's local rank."""
        return self._channel("rail")  # type: ignore[return-value]

    @property
    def min_node_size(self) -> int:
        """Ranks on the smallest node."""
        return min(len(r) for r in self.state.node_ranks)


def open_call(
    state: CommState, collective: str, algorithm: str, nbytes: int, blocking: bool = True
) -> Call:
    """Start a call: take the next tag and set up its counters."""
    return Call(state, CollectiveStats(collective, algorithm, nbytes), state.next_tag(), blocking)


def on_flat(schedule: Callable[..., Schedule]) -> Callable[..., Schedule]:
    """Adapt a schedule written for one channel to a call: it runs on all ranks, flat."""

    def run(call: Call, *args: Any) -> Schedule:
        return schedule(call.flat, *args)

    return run
