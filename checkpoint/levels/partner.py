"""The partner level: each rank's shard also on a rank of the next node (SCR's PARTNER).

Rank r with local rank i on node n sends its shard to the rank with local rank
``i mod size(n+1)`` on node ``n+1`` (a ring over nodes), which keeps it as
``copy-rank<r>.shard``. Losing any one node's storage loses no shard: its ranks' copies
live on the next node, and the copies it held are of ranks whose own files survive.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from ..shard import EncodedShard, decode_shard, read_file
from ..state import CheckpointError
from .base import PIECE_BYTES, Job, Level, link_or_write

__all__ = ["PartnerLevel", "partner_of"]

_TAG_SIZE, _TAG_DATA = 71, 72


def partner_of(job: Job, rank: int) -> int:
    """The rank that keeps ``rank``'s copy."""
    node = (job.node_of[rank] + 1) % job.n_nodes
    ranks = job.ranks_of[node]
    return ranks[job.local_rank_of[rank] % len(ranks)]


class PartnerLevel(Level):
    """``node<N>/partner/v<step>/rank<R>.shard`` and ``copy-rank<Q>.shard`` for held ranks.

    A job on a single node has no partner level (a copy on the same node protects
    nothing; use a virtual layout to test), except one that ``hpcpar launch
    --restarts`` started again on the one node left after the others were lost: it
    restores from the copies its lost nodes' partners kept, and until it runs on more
    nodes again its new copies stay on its own node (rank 0 says so once).

    Raises:
        CheckpointError: the job has a single node and is not such a restart.
    """

    name = "partner"
    survives = "the loss of any one node (a copy of each shard lives on the next node)"

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        if job.n_nodes < 2:
            from hpcpar.runtime import settings

            if not settings.value("HPCPAR_RESTART_FAILED"):
                raise CheckpointError(
                    "the partner level needs at least 2 nodes; this job has 1 "
                    "(use a layout such as ppn:1 to simulate nodes)"
                )
            if job.rank == 0:
                import sys

                sys.stderr.write(
                    "hpcpar: warning: this restarted job runs on one node: the partner "
                    "level restores from the copies kept for the lost nodes, and keeps "
                    "its new copies on this node (they survive no node loss)\n"
                )
        self.partner = partner_of(job, job.rank)
        self.held = [r for r in range(job.size) if partner_of(job, r) == job.rank]

    def copy_path(self, step: int, rank: int) -> Path:
        """Where this rank keeps ``rank``'s copy."""
        return self.version_dir(step) / f"copy-rank{rank}.shard"

    def files(self, step: int) -> list[Path]:
        """Own shard and the copies held."""
        return [self.own_path(step)] + [self.copy_path(step, r) for r in self.held]

    def _stream(self, copies: dict[int, Path], source: int | None) -> np.ndarray | None:
        """Send each file of ``copies`` (rank -> held copy) to its rank; receive from ``source``.

        A file goes in pieces of ``PIECE_BYTES`` read into two buffers in turn, so reading
        the next piece overlaps sending the last; the receiver posts every piece's
        receive before anything is sent (two ranks may each hold the other's copy).
        A file that cannot be read is sent as size -1 (nothing); one that fails part way
        is padded with zeros to the size announced, and fails its checks on arrival.
        Returns the bytes received from ``source`` (None: nothing, or no ``source``).
        """
        from mpi4py import MPI

        comm = self.job.comm
        sizes = {}
        for dest, path in copies.items():
            try:
                sizes[dest] = np.array([path.stat().st_size], dtype=np.int64)
            except OSError:
                sizes[dest] = np.array([-1], dtype=np.int64)
        sends = [comm.Isend(size, dest=dest, tag=_TAG_SIZE) for dest, size in sizes.items()]
        data, receives = None, []
        if source is not None:
            size = np.empty(1, dtype=np.int64)
            comm.Recv(size, source=source, tag=_TAG_SIZE)
            if size[0] >= 0:
                data = np.empty(int(size[0]), dtype=np.uint8)
                receives = [
                    comm.Irecv(data[start : start + PIECE_BYTES], source=source, tag=_TAG_DATA)
                    for start in range(0, data.size, PIECE_BYTES)
                ]
        for dest, path in copies.items():
            if sizes[dest][0] >= 0:
                sends += _send_file(comm, path, int(sizes[dest][0]), dest)
        MPI.Request.Waitall(sends + receives)
        return data

    def write(
        self, step: int, shard: EncodedShard, flat: dict[str, Any], written: dict[str, Path]
    ) -> str:
        """Send the own shard to the partner, write it, write the copies as they arrive.

        The shard goes as views of its own bytes, in pieces of at most ``PIECE_BYTES``,
        and each copy received is written piece by piece: no rank holds a whole shard
        besides its own. Every piece is received (and dropped, after a failed write), so
        the partner's sends always finish.
        """
        from mpi4py import MPI

        comm = self.job.comm
        sends = [comm.Isend(np.array([shard.nbytes], dtype=np.int64), self.partner, _TAG_SIZE)]
        for seg in shard.segments():
            view = np.frombuffer(memoryview(seg).cast("B"), dtype=np.uint8)
            for start in range(0, view.size, PIECE_BYTES):
                sends.append(comm.Isend(view[start : start + PIECE_BYTES], self.partner, _TAG_DATA))
        error = ""
        try:
            link_or_write(self, self.own_path(step), shard, written)
        except OSError as exc:
            error = f"rank {self.job.rank}: {exc.strerror or exc}"
        for rank in self.held:
            copy = _Incoming(comm, rank, step)
            try:
                if not error:
                    self.write_shard(self.copy_path(step, rank), copy)
            except OSError as exc:
                error = f"rank {self.job.rank}: {exc.strerror or exc}"
            finally:
                copy.drain()
        MPI.Request.Waitall(sends)
        if error:
            return error
        written[self.name] = self.own_path(step)
        return ""

    def recover(self, step: int, need: bool) -> tuple[dict[str, Any] | None, str]:
        """Own shard if whole, else the partner's copy (verified on arrival)."""
        flat, reason = None, ""
        if need:
            try:
                flat = read_file(self.own_path(step), step, self.job.rank)
            except CheckpointError as exc:
                reason = str(exc)
        missing = self.job.comm.allgather(need and flat is None)
        copies = {rank: self.copy_path(step, rank) for rank in self.held if missing[rank]}
        data = self._stream(copies, self.partner if missing[self.job.rank] else None)
        if missing[self.job.rank]:
            if data is None:
                return None, f"{reason}; and the partner copy on rank {self.partner} is lost"
            try:  # failing here alone would leave the other ranks in the next collective
                return decode_shard(data, step, self.job.rank, where="partner copy"), ""
            except CheckpointError as exc:
                return None, f"{reason}; and the partner copy failed its checks on arrival: {exc}"
        return flat, reason


def _send_file(comm: Any, path: Path, size: int, dest: int) -> list[Any]:
    """Send ``size`` bytes of ``path`` to ``dest`` in pieces (zeros where reading fails).

    Two buffers in turn: a piece is read while the one before it is on its way.
    Returns the last two sends, still running.
    """
    buffers = [np.empty(min(size, PIECE_BYTES), dtype=np.uint8) for _ in range(2)]
    pending: list[Any] = [None, None]
    try:
        handle: Any = open(path, "rb")  # noqa: SIM115 (a with block below)
    except OSError:
        handle = io.BytesIO()  # gone since its size was taken: zeros
    with handle:
        for k, start in enumerate(range(0, size, PIECE_BYTES)):
            piece = buffers[k % 2][: min(PIECE_BYTES, size - start)]
            if pending[k % 2] is not None:
                pending[k % 2].Wait()
            piece[_read_into(handle, piece) :] = 0
            pending[k % 2] = comm.Isend(piece, dest=dest, tag=_TAG_DATA)
    return [r for r in pending if r is not None]


def _read_into(handle: Any, piece: np.ndarray) -> int:
    """Fill ``piece`` from ``handle``; the bytes read (fewer at the end or on an error)."""
    view, got = memoryview(piece), 0
    try:
        while got < len(view):
            n = handle.readinto(view[got:])
            if not n:
                break
            got += n
    except OSError:
        pass
    return got


class _Incoming(EncodedShard):
    """A partner's shard as it arrives: its pieces are the body, received when written."""

    def __init__(self, comm: Any, source: int, step: int) -> None:
        size = np.empty(1, dtype=np.int64)
        comm.Recv(size, source=source, tag=_TAG_SIZE)
        self.step, self.rank, self.body_nbytes = step, source, int(size[0])
        self._comm, self._left = comm, self.body_nbytes
        self._buffer = np.empty(min(self.body_nbytes, PIECE_BYTES), dtype=np.uint8)
        self.body = self._receive()

    def _receive(self) -> Any:
        from mpi4py import MPI

        status = MPI.Status()
        while self._left > 0:
            self._comm.Probe(source=self.rank, tag=_TAG_DATA, status=status)
            n = status.Get_count(MPI.BYTE)
            self._comm.Recv(self._buffer[:n], source=self.rank, tag=_TAG_DATA)
            self._left -= n
            yield self._buffer[:n]

    def drain(self) -> None:
        """Receive the pieces not yet taken (a write that failed part way, or none)."""
        for _ in self.body:
            pass

    def tail(self) -> bytes:
        return b""

    def hashed(self) -> bool:
        return True


LEVEL = PartnerLevel  # what levels/__init__.py registers
