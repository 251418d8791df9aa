"""Resharding, carried out: the moves of a plan, read, sent and placed on each rank."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..levels.base import PIECE_BYTES
from ..sharding import Block, split_box
from ..state import CheckpointError
from .plan import Leaf, moves_of, outputs_of

__all__ = ["Mover", "transfer"]

TAG = 73


class Mover:
    """Runs the moves on one rank: reads what it serves, sends, receives, places."""

    def __init__(self, comm: Any, openers: dict[int, Any], chosen: dict[int, str]) -> None:
        self.comm, self.rank = comm, comm.Get_rank()
        self.openers, self.chosen = openers, chosen
        self.sources: dict[int, Any] = {}
        self.errors: dict[int, str] = {}  # saved rank -> why its data could not be read
        self.pieces = [np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.uint8)]
        self.pending: list[Any] = [None, None]  # the send of each piece buffer
        self.turn = 0

    def open(self, r: int) -> None:
        """Open saved rank ``r``'s source (once; a failure is noted, not raised)."""
        if r not in self.sources and r not in self.errors:
            try:
                self.sources[r] = self.openers[r][self.chosen[r]]()
            except CheckpointError as exc:
                self.errors[r] = str(exc)

    def prefetch(self, r: int, name: str, src: tuple[int, ...], box: tuple[int, ...]) -> None:
        """Tell saved rank ``r``'s source what will be read."""
        self.open(r)
        if r in self.sources:
            self.sources[r].prefetch(name, src, box)

    def move(
        self,
        name: str,
        r: int,
        server: int,
        src: tuple[int, ...],
        box: tuple[int, ...],
        client: int,
        target: Any,
        dst: tuple[int, ...],
    ) -> None:
        """Move saved rank ``r``'s ``box`` of leaf ``name``, piece by piece.

        ``server`` reads it at ``src``; it goes to ``target`` at ``dst`` on ``client``
        (-1: every rank). Pieces land in place where the target's part is contiguous;
        the server sends one piece while it reads the next (two half pieces in turn).
        """
        if self.rank == server:
            self.open(r)
        dtype = target.dtype
        for sub_off, sub in split_box(box, dtype.itemsize, PIECE_BYTES // 2):
            at = tuple(slice(d + o, d + o + n) for d, o, n in zip(dst, sub_off, sub, strict=True))
            origin = tuple(s + o for s, o in zip(src, sub_off, strict=True))
            nbytes = math.prod(sub) * dtype.itemsize
            view = None
            if client in (self.rank, -1) and isinstance(target, np.ndarray) and target.ndim:
                view = target[at]
                view = view if view.flags.c_contiguous else None
            if self.rank == server:
                if client == self.rank and view is not None:  # read straight into place
                    self.read(r, name, origin, sub, view)
                    continue
                raw = self._buffer(nbytes)
                buf = raw.view(dtype).reshape(sub)
                self.read(r, name, origin, sub, buf)
                if client == -1:
                    self.comm.Bcast(raw, root=server)
                elif client != server:
                    self.pending[self.turn] = self.comm.Isend(raw, dest=client, tag=TAG)
                    continue
                target[at] = buf
                continue
            raw = view.reshape(-1).view(np.uint8) if view is not None else self._buffer(nbytes)
            if client == -1:
                self.comm.Bcast(raw, root=server)
            else:
                self.comm.Recv(raw, source=server, tag=TAG)
            if view is None:
                target[at] = raw.view(dtype).reshape(sub)

    def _buffer(self, nbytes: int) -> np.ndarray:
        """The next of the two piece buffers, once its last send is done."""
        self.turn ^= 1
        if self.pending[self.turn] is not None:
            self.pending[self.turn].Wait()
            self.pending[self.turn] = None
        if self.pieces[self.turn].size < nbytes:
            self.pieces[self.turn] = np.empty(max(nbytes, 1 << 20), dtype=np.uint8)
        return self.pieces[self.turn][:nbytes]

    def finish(self) -> None:
        """Wait for the sends still in flight."""
        for i, request in enumerate(self.pending):
            if request is not None:
                request.Wait()
                self.pending[i] = None

    def read(
        self, r: int, name: str, origin: tuple[int, ...], box: tuple[int, ...], out: np.ndarray
    ) -> None:
        """Read a box of saved rank ``r``'s leaf.

        After a failure: zeros (the round is then retried from another level).
        """
        if r not in self.errors:
            try:
                self.sources[r].read_box(name, origin, box, out)
                return
            except CheckpointError as exc:
                self.errors[r] = str(exc)
            except KeyError:
                self.errors[r] = f"{name!r} is missing from saved rank {r}'s data"
        out.reshape(-1).view(np.uint8)[:] = 0

    def close(self) -> None:
        """Close the sources read."""
        for source in self.sources.values():
            source.close()


def transfer(
    comm: Any,
    leaves: dict[str, Leaf],
    targets: dict[str, list[Block]],
    serve: Any,
    openers: dict[int, Any],
    chosen: dict[int, str],
    old: int,
    per_rank: Any,
    alloc: Any,
) -> tuple[dict[str, Any], dict[int, str]]:
    """Run the moves; this rank's new flat state and the saved ranks it found damaged."""
    rank, size = comm.Get_rank(), comm.Get_size()
    alloc = alloc or (lambda key, shape, dtype: np.empty(shape, dtype))
    outputs, flat = outputs_of(leaves, targets, rank, size, old, per_rank, alloc)
    mover = Mover(comm, openers, chosen)
    # every rank runs the moves in one order, so a rank blocked in a send or receive
    # waits only for its partner's earlier moves: the moves between ranks go first, and
    # each rank's reads for itself after them run at the same time as the others'
    moves = sorted(
        moves_of(leaves, targets, old, size, per_rank), key=lambda m: serve(m[1], m[4]) == m[4]
    )
    try:
        for name, r, src, box, client, _, _ in moves:  # the disk reads ahead while we work
            if serve(r, client) == rank and math.prod(box):
                mover.prefetch(r, name, src, box)
        for name, r, src, box, client, key, dst in moves:
            server = serve(r, client)
            if (client not in (rank, -1) and rank != server) or not math.prod(box):
                continue
            mover.move(name, r, server, src, box, client, outputs[key], dst)
        mover.finish()
    finally:
        mover.close()
    for key, value in outputs.items():
        if isinstance(key, tuple):
            flat.setdefault(key[0], [None] * old)[key[1]] = value
        else:
            flat[key] = value
    return flat, mover.errors
