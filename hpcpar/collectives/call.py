"""One collective call: its channels on every level, its counters, its state."""

from __future__ import annotations

from dataclasses import dataclass

from .channel import Channel, CollectiveStats
from .state import CommState

__all__ = ["Call", "open_call"]


@dataclass
class Call:
    """Everything an algorithm needs for one call.

    Attributes:
        state: The communicator's cached state (hierarchy, node lists).
        stats: This call's counters.
        flat: All ranks.
        node: The ranks of this rank's node.
        leaders: One rank per node (None on non-leaders).
        rail: The ranks with this rank's local rank.
    """

    state: CommState
    stats: CollectiveStats
    flat: Channel
    node: Channel
    leaders: Channel | None
    rail: Channel

    @property
    def min_node_size(self) -> int:
        """Ranks on the smallest node."""
        return min(len(r) for r in self.state.node_ranks)


def open_call(state: CommState, collective: str, algorithm: str, nbytes: int) -> Call:
    """Start a call: take the next tag and make its counted channels."""
    stats = CollectiveStats(collective, algorithm, nbytes)
    ch = state.channels(state.next_tag(), stats)
    return Call(state, stats, ch["flat"], ch["node"], ch["leaders"], ch["rail"])  # type: ignore[arg-type]
