"""The XOR level: parity across sets of ranks on different nodes (SCR's XOR scheme).

Nodes form groups of ``k`` consecutive nodes (a last group of one node joins the one
before). In a group, ranks on distinct nodes form XOR sets of ``m`` members. Each member's
shard is cut into ``m - 1`` chunks; member ``j`` keeps the XOR of one chunk of every other
member (member ``i`` contributes its chunk ``(j - i - 1) mod m``), computed by
``Reduce_scatter_block`` with ``MPI.BXOR`` on 8-byte words. Parity costs ``1/(m-1)`` of the
data, and any one lost member is rebuilt: each of its chunks is the XOR of the parity
that covers it and the matching chunks of the survivors (``Reduce`` to the lost member).
Both run in pieces of ``PIECE_BYTES``, so that neither hpcpar nor the MPI library holds
another copy of a whole shard (``hpcpar bench checkpoint`` measures the rebuild).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..parity import chunk_length, chunk_start, covering, fits
from ..shard import EncodedShard, decode_shard, encode_shard, read_bytes
from ..state import CheckpointError
from .base import PIECE_BYTES, Job, Level, link_or_write

__all__ = ["XorLevel", "xor_sets"]


def xor_sets(job: Job, k: int) -> list[list[int]]:
    """Split the job's ranks into XOR sets (each on distinct nodes, of size >= 2).

    Raises:
        CheckpointError: a single node, or a layout where some rank cannot be paired with
            ranks of other nodes (one node holding more ranks than the rest of its group).
    """
    if job.n_nodes < 2:
        raise CheckpointError(
            "the xor level needs at least 2 nodes; this job has 1 "
            "(use a layout such as ppn:1 to simulate nodes)"
        )
    groups = [list(range(s, min(s + k, job.n_nodes))) for s in range(0, job.n_nodes, k)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        last = groups.pop()
        groups[-1] += last
    sets: list[list[int]] = []
    for nodes in groups:
        # local-rank-major order: consecutive ranks are on different nodes
        order = [
            ranks[i]
            for i in range(max(len(job.ranks_of[n]) for n in nodes))
            for n in nodes
            for ranks in [job.ranks_of[n]]
            if i < len(ranks)
        ]
        chunks: list[list[int]] = []
        for rank in order:
            node = job.node_of[rank]
            if (
                chunks
                and len(chunks[-1]) < len(nodes)
                and all(job.node_of[r] != node for r in chunks[-1])
            ):
                chunks[-1].append(rank)
            else:
                chunks.append([rank])
        for single in [c for c in chunks if len(c) == 1]:
            node = job.node_of[single[0]]
            home = next(
                (c for c in chunks if len(c) > 1 and all(job.node_of[r] != node for r in c)),
                None,
            )
            if home is None:  # take a member from a set that can spare one
                donor = next((c for c in chunks if len(c) > 2), None)
                if donor is not None:
                    moved = next(r for r in reversed(donor) if job.node_of[r] != node)
                    donor.remove(moved)
                    single.append(moved)
                    continue
                raise CheckpointError(
                    f"xor level: rank {single[0]} has no partner on another node of its group "
                    f"(nodes {nodes[0]}-{nodes[-1]}); use more nodes per group or an even layout"
                )
            home.append(single[0])
            chunks.remove(single)
        sets += [sorted(c) for c in chunks]
    return sets


def _pieces(c: int) -> list[tuple[int, int]]:
    """(start, length) of the pieces of a chunk of ``c`` bytes."""
    return [(start, min(PIECE_BYTES, c - start)) for start in range(0, c, PIECE_BYTES)]


def _padded(raw: np.ndarray, begin: int, n: int) -> np.ndarray:
    """``raw[begin:begin + n]``, zero-padded where it runs past ``raw``'s end."""
    if begin + n <= raw.size:
        return raw[begin : begin + n]
    part = np.zeros(n, dtype=np.uint8)
    have = raw[begin : begin + n]
    part[: have.size] = have
    return part


def _typed(part: np.ndarray, words: bool) -> list[Any]:
    """``[buffer, MPI type]`` of a piece, as 8-byte words where allowed.

    Words (the XOR runs a word at a time) when ``words`` and the piece's length allows,
    else bytes.
    """
    from mpi4py import MPI

    if not words or part.size % 8:
        return [part, MPI.BYTE]
    if part.ctypes.data % 8:  # (a piece sent, never the root's: its buffer is aligned)
        part = part.copy()
    return [part.view(np.uint64), MPI.UINT64_T]


def _check_group(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        return "must be an integer >= 2"
    return ""


class XorLevel(Level):
    """``node<N>/xor/v<step>/rank<R>.shard`` and ``rank<R>.parity``.

    Args:
        job: The job.
        group: Nodes per XOR group (the policy's ``xor_group``, default 4).
    """

    name = "xor"
    survives = "the loss of one node in each XOR group (rebuilt from parity)"
    options: ClassVar[dict[str, tuple[Any, Callable[[Any], str]]]] = {
        "xor_group": (4, _check_group),  # nodes per XOR group
    }

    @classmethod
    def create(cls, job: Job, options: dict[str, Any]) -> XorLevel:
        """The level with the policy's ``xor_group`` (nodes per XOR group)."""
        return cls(job, options["xor_group"])

    def __init__(self, job: Job, group: int = 4) -> None:
        super().__init__(job)
        self.sets = xor_sets(job, group)
        mine = next(s for s in self.sets if job.rank in s)
        self.members = mine
        self.index = mine.index(job.rank)
        self.set_comm = job.comm.Split(self.sets.index(mine), job.rank)

    def parity_path(self, step: int) -> Path:
        """This rank's parity file."""
        return self.version_dir(step) / f"rank{self.job.rank}.parity"

    def files(self, step: int) -> list[Path]:
        """Own shard and parity."""
        return [self.own_path(step), self.parity_path(step)]

    def _chunk_at(self, j: int, c: int) -> int:
        """Where the chunk of this member's shard that member ``j``'s parity covers starts."""
        return chunk_start(self.index, j, len(self.members), c)

    def write(
        self, step: int, shard: EncodedShard, flat: dict[str, Any], written: dict[str, Path]
    ) -> str:
        """Compute this member's parity (collective in the set), write shard and parity."""
        from mpi4py import MPI

        m = len(self.members)
        lengths = self.set_comm.allgather(shard.nbytes)
        c = chunk_length(lengths)
        parity = np.empty(c, dtype=np.uint8)
        send = np.empty(m * min(c, PIECE_BYTES), dtype=np.uint8)
        words = c % 8 == 0  # (always, but where a test writes parity as before)
        for start, n in _pieces(c):  # member j's parity: one piece of it at a time
            block = send[: m * n].reshape(m, n)
            block[self.index] = 0
            for j in range(m):
                if j != self.index:
                    shard.read_into(self._chunk_at(j, c) + start, block[j])
            self.set_comm.Reduce_scatter_block(
                _typed(block.reshape(-1), words),
                _typed(parity[start : start + n], words),
                op=MPI.BXOR,
            )
        meta = {"parity": parity, "members": self.members, "lengths": lengths, "chunk": c}
        try:
            link_or_write(self, self.own_path(step), shard, written)
            self.write_shard(self.parity_path(step), encode_shard(step, self.job.rank, meta))
        except OSError as exc:
            return f"rank {self.job.rank}: {exc.strerror or exc}"
        written[self.name] = self.own_path(step)
        return ""

    def recover(self, step: int, need: bool) -> tuple[dict[str, Any] | None, str]:
        """Own shard if whole; a set's single lost member rebuilt from parity."""
        comm, rank = self.set_comm, self.job.rank
        raw: np.ndarray | None = None
        flat, reason = None, ""
        try:
            raw = read_bytes(self.own_path(step))
            flat = decode_shard(raw, step, rank, where=str(self.own_path(step)))
        except CheckpointError as exc:
            raw, reason = None, str(exc)
        lost = comm.allgather(flat is None)
        wanted = comm.allgather(need and flat is None)
        if not any(wanted):
            return (flat if need else None), reason
        if sum(lost) > 1:
            gone = [self.members[i] for i, x in enumerate(lost) if x]
            return None, f"{reason}; XOR set {self.members} lost ranks {gone}, parity covers one"
        q = lost.index(True)
        meta: dict[str, Any] | None = None
        if self.index != q:
            try:
                meta = decode_shard(read_bytes(self.parity_path(step)), step, rank, where="parity")
            except CheckpointError:
                meta = None
        if meta is not None and not self._whole(meta):
            meta = None  # damaged, or written with another xor_group: the sets differ
        ok = comm.allgather(self.index == q or meta is not None)
        if not all(ok):
            return None, (
                f"{reason}; parity of XOR set {self.members} is damaged "
                "(or was written with another xor_group)"
            )
        shape = comm.bcast(
            (meta["lengths"], meta["chunk"]) if meta is not None else None,
            root=(q + 1) % len(self.members),
        )
        lengths, c = shape
        out = self._rebuild(q, c, raw, meta)
        if out is None:
            return (flat if need else None), ""
        try:  # failing here alone would leave the other ranks in the next collective
            return decode_shard(out[: lengths[q]], step, rank, where="XOR rebuild"), ""
        except CheckpointError as exc:
            return None, f"{reason}; and the XOR rebuild failed its checks: {exc}"

    def _whole(self, meta: dict[str, Any]) -> bool:
        """Whether a parity file's description fits this set (not crafted or damaged)."""
        lengths, chunk, parity = meta.get("lengths"), meta.get("chunk"), meta.get("parity")
        return (
            meta.get("members") == self.members
            and fits(self.members, lengths, chunk)
            and isinstance(parity, np.ndarray)
            and parity.dtype == np.uint8
            and parity.size == chunk
        )

    def _rebuild(
        self, q: int, c: int, raw: np.ndarray | None, meta: dict[str, Any] | None
    ) -> np.ndarray | None:
        """Member ``q``'s padded shard, there (None elsewhere).

        Its chunk ``t`` is the XOR of the parity that covers it and the matching chunks
        of the others: one ``Reduce`` per piece of each chunk, from views of the shards
        as read. Parity written by earlier versions may have chunks of odd lengths: bytes then.
        """
        from mpi4py import MPI

        comm, m = self.set_comm, len(self.members)
        words = c % 8 == 0  # the same on every member, as MPI needs
        out = np.zeros((m - 1) * c, dtype=np.uint8) if self.index == q else None
        for t in range(m - 1):
            j = covering(q, t, m)
            for start, n in _pieces(c):
                if out is not None:  # zeros, XOR's identity, as the lost member's share
                    piece = _typed(out[t * c + start :][:n], words)
                    comm.Reduce(MPI.IN_PLACE, piece, op=MPI.BXOR, root=q)
                elif self.index == j:
                    piece = meta["parity"][start : start + n]  # type: ignore[index]
                    comm.Reduce(_typed(piece, words), None, op=MPI.BXOR, root=q)
                else:
                    piece = _padded(raw, self._chunk_at(j, c) + start, n)  # type: ignore[arg-type]
                    comm.Reduce(_typed(piece, words), None, op=MPI.BXOR, root=q)
        return out

    def describe(self) -> dict[str, Any]:
        """The level and its sets."""
        return {"level": self.name, "sets": self.sets}

    def close(self) -> None:
        """Free the XOR set's communicator."""
        self.set_comm.Free()


LEVEL = XorLevel  # what levels/__init__.py registers
