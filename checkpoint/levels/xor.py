"""The XOR level: parity across sets of ranks on different nodes (SCR's XOR scheme).

Nodes form groups of ``k`` consecutive nodes (a last group of one node joins the one
before). In a group, ranks on distinct nodes form XOR sets of ``m`` members. Each member's
shard is cut into ``m - 1`` chunks; member ``j`` keeps the XOR of one chunk of every other
member (member ``i`` contributes its chunk ``(j - i - 1) mod m``), computed by one
``Reduce_scatter_block`` with ``MPI.BXOR``. Parity costs ``1/(m-1)`` of the data, and any
one lost member is rebuilt: each of its chunks is the XOR of the parity that covers it
and the matching chunks of the survivors (one ``Reduce`` to the lost member).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..shard import EncodedShard, decode_shard, encode_shard, read_bytes
from ..state import CheckpointError
from .base import Job, Level, link_or_write

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


class XorLevel(Level):
    """``node<N>/xor/v<step>/rank<R>.shard`` and ``rank<R>.parity``.

    Args:
        job: The job.
        group: Nodes per XOR group (the policy's ``xor_group``, default 4).
    """

    name = "xor"

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

    def _chunk(self, padded: np.ndarray, j: int, c: int) -> np.ndarray:
        """The chunk of this member's shard that member ``j``'s parity covers."""
        k = (j - self.index - 1) % len(self.members)
        return padded[k * c : (k + 1) * c]

    def write(
        self, step: int, shard: EncodedShard, flat: dict[str, Any], written: dict[str, Path]
    ) -> str:
        """Compute this member's parity (collective in the set), write shard and parity."""
        from mpi4py import MPI

        m = len(self.members)
        lengths = self.set_comm.allgather(shard.nbytes)
        c = max(1, math.ceil(max(lengths) / (m - 1)))
        padded = shard.join((m - 1) * c)
        send = np.zeros(m * c, dtype=np.uint8)
        for j in range(m):
            if j != self.index:
                send[j * c : (j + 1) * c] = self._chunk(padded, j, c)
        parity = np.empty(c, dtype=np.uint8)
        self.set_comm.Reduce_scatter_block([send, MPI.BYTE], [parity, MPI.BYTE], op=MPI.BXOR)
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
        from mpi4py import MPI

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
        if meta is not None and meta.get("members") != self.members:
            meta = None  # written with another xor_group: the sets differ
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
        m = len(self.members)
        contrib = np.zeros((m - 1) * c, dtype=np.uint8)
        if self.index != q:
            padded = np.zeros((m - 1) * c, dtype=np.uint8)
            padded[: raw.size] = raw  # type: ignore[union-attr]
            for t in range(m - 1):
                j = (q + t + 1) % m
                part = meta["parity"] if self.index == j else self._chunk(padded, j, c)  # type: ignore[index]
                contrib[t * c : (t + 1) * c] = part
        out = np.empty_like(contrib) if self.index == q else None
        comm.Reduce(
            [contrib, MPI.BYTE], [out, MPI.BYTE] if out is not None else None, op=MPI.BXOR, root=q
        )
        if self.index != q:
            return (flat if need else None), ""
        rebuilt = out[: lengths[q]]  # type: ignore[index]
        return decode_shard(rebuilt, step, rank, where="XOR rebuild"), ""

    def describe(self) -> dict[str, Any]:
        """The level and its sets."""
        return {"level": self.name, "sets": self.sets}
