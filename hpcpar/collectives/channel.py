"""Counted point-to-point on one communicator of a collective call.

Every algorithm sends through a ``Channel``, which records each message and its bytes
as intra-node or inter-node (by the hierarchy's node of each end), so the cost model can
be checked against what an algorithm really sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..runtime.switches import HOT
from .registry import LIBRARY

__all__ = [
    "Channel",
    "CollectiveStats",
    "combine",
    "even_counts",
    "offsets",
    "last_stats",
    "remember_stats",
    "note_library_call",
]


@dataclass(slots=True)
class CollectiveStats:
    """What one collective call sent from this rank.

    Attributes:
        collective: ``allreduce``, ``bcast`` ...
        algorithm: The algorithm that ran.
        nbytes: Size of the call's buffer on this rank, in bytes.
        messages_intra / bytes_intra: Sends to ranks on the same node.
        messages_inter / bytes_inter: Sends to ranks on other nodes.
        reduced_bytes: Bytes this rank combined with the reduction op.
        inside_mpi: True when the MPI library did the work (nothing is counted then).
    """

    collective: str
    algorithm: str
    nbytes: int
    messages_intra: int = 0
    bytes_intra: int = 0
    messages_inter: int = 0
    bytes_inter: int = 0
    reduced_bytes: int = 0
    inside_mpi: bool = False
    steps: list[str] = field(default_factory=list)

    @property
    def messages(self) -> int:
        """All messages sent."""
        return self.messages_intra + self.messages_inter

    @property
    def bytes_sent(self) -> int:
        """All bytes sent."""
        return self.bytes_intra + self.bytes_inter


class Channel:
    """Nonblocking sends and receives of numpy arrays on one communicator, counted.

    Args:
        comm: The communicator (the call's private one, or a node/leader/rail one).
        nodes: The node index of every rank of ``comm``.
        tag: The tag of this call (different concurrent calls use different tags).
        stats: Where sends are counted.
    """

    def __init__(
        self, comm: MPI.Intracomm, nodes: list[int], tag: int, stats: CollectiveStats
    ) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.nodes = nodes
        self.tag = tag
        self.stats = stats

    def retag(self, offset: int) -> Channel:
        """The same channel with another tag, for sub-schedules that run side by side."""
        return Channel(self.comm, self.nodes, self.tag + offset, self.stats)

    def isend(self, buf: np.ndarray, dest: int) -> list[MPI.Request]:
        """Post a send of ``buf`` (contiguous) to ``dest``; nothing is sent when it is empty."""
        if buf.nbytes == 0:
            return []
        if self.nodes[dest] == self.nodes[self.rank]:
            self.stats.messages_intra += 1
            self.stats.bytes_intra += buf.nbytes
        else:
            self.stats.messages_inter += 1
            self.stats.bytes_inter += buf.nbytes
        return [self.comm.Isend(_bytes(buf), dest, self.tag)]

    def irecv(self, buf: np.ndarray, source: int) -> list[MPI.Request]:
        """Post a receive into ``buf`` (contiguous) from ``source``; none when it is empty."""
        if buf.nbytes == 0:
            return []
        return [self.comm.Irecv(_bytes(buf), source, self.tag)]

    def exchange(self, send: np.ndarray, recv: np.ndarray, peer: int) -> list[MPI.Request]:
        """Post a send to and a receive from ``peer``."""
        return self.irecv(recv, peer) + self.isend(send, peer)


def _bytes(buf: np.ndarray) -> np.ndarray:
    # Raw bytes move any dtype (complex, bool, structured) without an MPI type map.
    return buf.reshape(-1).view(np.uint8)


def combine(ch: Channel, op: object, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a op b`` (``a`` from lower ranks), counting the bytes reduced."""
    op.combine(a, b, out)  # type: ignore[attr-defined]
    ch.stats.reduced_bytes += out.nbytes


def even_counts(n: int, parts: int) -> list[int]:
    """Split ``n`` elements into ``parts`` nearly equal counts (larger ones first)."""
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def offsets(counts: list[int]) -> list[int]:
    """Start of each block for ``counts`` laid out back to back (one more at the end)."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def remember_stats(stats: CollectiveStats) -> None:
    """Record the counters of the collective this rank just completed."""
    HOT.last_call = stats


def note_library_call(collective: str, nbytes: int) -> None:
    """Record a call the library made alone (its stats are made up if someone asks)."""
    HOT.last_call = (collective, nbytes)


def last_stats() -> CollectiveStats | None:
    """Counters of the collective this rank completed last (messages and bytes per level)."""
    last = HOT.last_call
    if type(last) is tuple:  # the library's call, made by the fast path: made up on demand
        stats = CollectiveStats(last[0], LIBRARY, last[1])
        stats.inside_mpi = True
        HOT.last_call = last = stats
    return last
