"""The compressed allreduce: exact inside each node, coded only across nodes.

The shape of ZeRO++'s qgZ, on hpcpar's hierarchy. The vector is cut into the codec's
blocks, and every cut below falls between blocks:

1. Inside each node a ring reduce-scatter (exact, in the data's own dtype) leaves local
   rank k holding slice k of the node's sum (slices as in the multi-leader allreduce:
   as many as the smallest node has ranks).
2. Along each rail (local rank k of every node) the slice is cut into one chunk per
   node. Each rank codes its slice and sends chunk j to node j (every rank decodes
   chunks alike: its own chunk is coded too); the owner of a chunk decodes the
   nodes' codes and sums them in node order, in float32 (float64 for float64 data),
   codes the sum once more and sends it to every node; every rank decodes every chunk.
3. Inside each node a ring allgather (exact) puts the slices together.

So only the bytes that cross the slow level are coded, the sum never accumulates in
the coded type, every rank ends with the same bits, and on one node nothing is coded
at all (the caller runs the exact allreduce instead). The result equals: decode(code(
sum over nodes of decode(code(node sum)))), block by block, summed in node order.

Error feedback (``feedback=``): an object with ``residuals(n, slice, chunk)`` returning
``(extra, worker, server)``: float32 residuals of this rank's slice and chunk, which the
coder adds before coding and leaves holding what the code lost, and ``extra``, a whole
vector to add to this rank's contribution once (a residual restored from a checkpoint
taken on another layout), or None. ``hpcpar.ErrorFeedback`` is one.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from typing import Any

import numpy as np
from mpi4py import MPI

from ...layout import format_ranks
from ..algorithms import recursive_doubling, ring
from ..call import Call
from ..channel import even_counts, offsets
from ..errors import CollectiveMismatchError
from ..ops import resolve_op
from ..registry import ORDER_NONE, Algorithm, Shape
from ..schedule import Schedule, concurrently
from ..tally import Counts, Groups, Layout, groups_of
from .schemes import Codec

__all__ = [
    "allreduce",
    "slices",
    "chunks",
    "segments",
    "count_allreduce",
    "coded_bytes",
    "record_for",
    "SEGMENT_BYTES",
]


def _block_counts(n: int, block: int, parts: int) -> list[int]:
    """Elements of ``parts`` pieces of ``n``, each a run of whole blocks (larger first)."""
    blocks = even_counts(-(-n // block), parts)
    out, start = [], 0
    for b in blocks:
        end = min(n, start + b * block)
        out.append(end - start)
        start = end
    return out


def slices(n: int, block: int, local_size: int, owners: int) -> list[int]:
    """Elements of each local rank's slice: ``owners`` of them own whole blocks, the rest none."""
    return _block_counts(n, block, owners) + [0] * (local_size - owners)


def chunks(m: int, block: int, nodes: int) -> list[int]:
    """Elements of each node's chunk of a slice of ``m`` elements."""
    return _block_counts(m, block, nodes)


class _Pool:
    """Scratch byte buffers reused across calls.

    A large call would otherwise fault its pages in again each time. A buffer is out of
    the pool while a call uses it, so calls in flight together never share one, and it
    goes back only when its call completed (a call abandoned with messages in flight
    keeps its buffers).
    """

    def __init__(self, keep: int = 8) -> None:
        self.free: dict[int, list[np.ndarray]] = {}
        self.keep = keep
        self.lock = threading.Lock()  # gradient threads call beside the program

    def take(self, nbytes: int) -> np.ndarray:
        with self.lock:
            spare = self.free.get(nbytes)
            if spare:
                return spare.pop()
        return np.empty(nbytes, np.uint8)

    def give(self, *bufs: np.ndarray) -> None:
        with self.lock:
            for buf in bufs:
                spare = self.free.setdefault(buf.nbytes, [])
                if len(spare) < 2:
                    spare.append(buf)
            while len(self.free) > self.keep:  # the oldest sizes go first
                self.free.pop(next(iter(self.free)))


_POOL = _Pool()


def _seed(call: Call, stage: int, node: int, seed: int) -> int:
    """Stochastic rounding's seed: different for every call, stage and node."""
    text = f"{seed}:{call.state.label}:{call.tag}:{stage}:{node}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


SEGMENT_BYTES = 1 << 20  # float32 bytes per pipeline segment (whole blocks)


def segments(n: int, block: int, segment_bytes: int = SEGMENT_BYTES) -> list[tuple[int, int]]:
    """The pipeline's segments of a vector of ``n`` elements: runs of whole blocks."""
    step = max(block, (segment_bytes // 4) // block * block)
    return [(a, min(n, a + step)) for a in range(0, n, step)] or [(0, 0)]


class _Segment:
    """One segment's geometry on this rank: its node slices, its slice, its chunk."""

    def __init__(self, lo: int, hi: int, codec: Codec, node_size: int, owners: int, rail: Any):
        self.lo, self.hi = lo, hi
        self.counts = slices(hi - lo, codec.block, node_size, owners)
        self.starts = offsets(self.counts)
        self.rail = rail
        self.acc: np.ndarray | None = None

    def part(self, local: int) -> tuple[int, int]:
        """This rank's slice, in the whole vector's positions."""
        return self.lo + self.starts[local], self.lo + self.starts[local + 1]

    def chunk(self, local: int, block: int) -> tuple[int, int]:
        """The chunk whose total this rank codes, in the whole vector's positions."""
        a, b = self.part(local)
        if self.rail is None:
            return a, a
        at = offsets(chunks(b - a, block, self.rail.size))
        return a + at[self.rail.rank], a + at[self.rail.rank + 1]


def allreduce(
    call: Call, buf: np.ndarray, op: object, codec: Codec, feedback: Any = None, seed: int = 0
) -> Schedule:
    """Sum float32/float64 ``buf`` over all ranks in place, coded across nodes.

    Large vectors flow through the four stages in segments (``SEGMENT_BYTES``), so one
    segment's coded bytes cross the link while the next is reduced inside the node and
    the one before is decoded and gathered.
    """
    yield from _agree(call, codec, feedback is not None)
    node = call.node
    owners = call.min_node_size
    mine = node.rank
    rail = call.rail if mine < owners else None
    segs = [
        _Segment(a, b, codec, node.size, owners, rail) for a, b in segments(buf.size, codec.block)
    ]
    worker = server = None
    if feedback is not None:
        extra, worker, server = feedback.residuals(
            buf.size,
            [s.part(mine) for s in segs] if rail is not None else [],
            [s.chunk(mine, codec.block) for s in segs] if rail is not None else [],
        )
        if extra is not None:
            buf += extra.astype(buf.dtype, copy=False)
    if rail is not None:
        call.stats.steps.append(
            f"coded across {rail.size} nodes: {codec.name}, blocks of {codec.block}"
            + (", stochastic rounding" if codec.stochastic else "")
            + (", error feedback" if feedback is not None else "")
            + (f", {len(segs)} segments pipelined" if len(segs) > 1 else "")
        )
    node_in, node_out = node.retag(1), node.retag(4)
    up = rail.retag(2) if rail is not None else None
    down = rail.retag(3) if rail is not None else None

    def stage(k: int, seg: _Segment) -> Schedule:
        piece = buf[seg.lo : seg.hi]
        if k == 0:
            yield from ring.reduce_scatter(node_in, piece, op, seg.counts)
        elif k == 3:
            yield from ring.allgather(node_out, piece, seg.counts)
        elif rail is not None:
            a, b = seg.part(mine)
            w = worker[a:b] if worker is not None else None
            c0, c1 = seg.chunk(mine, codec.block)
            v = server[c0:c1] if server is not None else None
            if k == 1:
                yield from _rail_sum(call, up, seg, buf[a:b], a, codec, w, seed)
            else:
                yield from _rail_spread(call, down, seg, buf[a:b], a, codec, v, seed)

    for t in range(len(segs) + 3):
        yield from concurrently(
            *(stage(k, segs[t - k]) for k in range(4) if 0 <= t - k < len(segs))
        )


def describe(codec: Codec, feedback: bool) -> str:
    """``int8 (blocks of 256, nearest, error feedback)``: what ranks must agree on."""
    rounding = "stochastic" if codec.stochastic else "nearest"
    tail = ", error feedback" if feedback else ""
    return f"{codec.name} (blocks of {codec.block}, {rounding}{tail})"


def _agree(call: Call, codec: Codec, feedback: bool) -> Schedule:
    """Check that every rank codes alike (a 16-byte allreduce on the call's channel).

    Ranks coding differently would send payloads of different sizes: this turns that
    into one clear error on every rank instead of a truncated message or a hang.
    """
    what = describe(codec, feedback)
    mark = int.from_bytes(hashlib.blake2b(what.encode(), digest_size=7).digest(), "little")
    both = np.array([mark, -mark], np.int64)
    yield from recursive_doubling.allreduce(call.flat, both, resolve_op(MPI.MAX, both.dtype))
    if both[0] == mark and -both[1] == mark:
        return
    if call.guard is not None:  # reported here on every rank: the guard need not again
        mark_of_call, number = call.guard
        call.state.guard_sum -= mark_of_call * number
    every = call.state.private.allgather(what)
    groups: dict[str, list[int]] = {}
    for rank, seen in enumerate(every):
        groups.setdefault(seen, []).append(rank)
    detail = "; ".join(f"{w} on rank(s) {format_ranks(r)}" for w, r in groups.items())
    raise CollectiveMismatchError(f"allreduce: ranks passed different compression: {detail}")


def _pieces(m: int, codec: Codec, p: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """A slice of ``m`` elements cut for ``p`` nodes.

    Returns the chunks' sizes and starts, and their payloads' sizes and starts.
    """
    parts = chunks(m, codec.block, p)
    sizes = [codec.wire_bytes(c) for c in parts]
    return parts, offsets(parts), sizes, offsets(sizes)


def _rail_sum(
    call: Call,
    ch: Any,
    seg: _Segment,
    part: np.ndarray,
    base: int,
    codec: Codec,
    worker: np.ndarray | None,
    seed: int,
) -> Schedule:
    """Code my slice, send chunk j to node j, sum my chunk's codes in node order."""
    p, me = ch.size, ch.rank
    parts, at, sizes, where = _pieces(part.size, codec, p)
    wide = part.dtype == np.float64
    sent, got = _POOL.take(where[-1]), _POOL.take(p * sizes[me])
    scratch = _POOL.take(4 * part.size) if worker is None and wide else None
    acc = _POOL.take(parts[me] * (8 if wide else 4)).view(np.float64 if wide else np.float32)
    if worker is not None:
        v = worker
        v += part  # the residual joins the contribution; the coder leaves the new one
    elif scratch is not None:
        v = scratch.view(np.float32)
        v[...] = part
    else:
        v = part
    requests = []
    drawn = _seed(call, 1, ch.nodes[me], seed)
    for j in [*range(me + 1, p), *range(me + 1)]:  # mine last: the others leave first
        codec.encode(
            v[at[j] : at[j + 1]],
            sent[where[j] : where[j + 1]],
            feedback=worker is not None,
            seed=drawn,
            start=base + at[j],
        )
        if j != me:
            requests += ch.irecv(got[j * sizes[me] : (j + 1) * sizes[me]], j)
            requests += ch.isend(sent[where[j] : where[j + 1]], j)
    yield requests
    got[me * sizes[me] : (me + 1) * sizes[me]] = sent[where[me] : where[me + 1]]
    for j in range(p):  # in node order, so every owner sums alike
        codec.decode(got[j * sizes[me] : (j + 1) * sizes[me]], acc, add=j > 0)
    call.stats.reduced_bytes += acc.nbytes * (p - 1)
    seg.acc = acc
    _POOL.give(sent, got, *([] if scratch is None else [scratch]))


def _rail_spread(
    call: Call,
    ch: Any,
    seg: _Segment,
    part: np.ndarray,
    base: int,
    codec: Codec,
    server: np.ndarray | None,
    seed: int,
) -> Schedule:
    """Code my chunk's sum once, send it to every node, decode every chunk."""
    p, me = ch.size, ch.rank
    _, at, _, where = _pieces(part.size, codec, p)
    acc = seg.acc
    assert acc is not None
    if server is not None:
        w = server
        w += acc
    else:
        w = acc if acc.dtype == np.float32 else acc.astype(np.float32)
    total = _POOL.take(where[-1])
    codec.encode(
        w,
        total[where[me] : where[me + 1]],
        feedback=server is not None,
        seed=_seed(call, 2, ch.nodes[me], seed),
        start=base + at[me],
    )
    requests = []
    for j in range(p):
        if j != me:
            requests += ch.irecv(total[where[j] : where[j + 1]], j)
            requests += ch.isend(total[where[me] : where[me + 1]], j)
    yield requests
    for j in range(p):
        codec.decode(total[where[j] : where[j + 1]], part[at[j] : at[j + 1]], add=False)
    _POOL.give(total, acc.view(np.uint8))
    seg.acc = None


# ---- exact counts ----------------------------------------------------------------------


def coded_bytes(layout: Layout, rank: int, count: int, codec: Codec) -> int:
    """Bytes of float32 ``rank`` codes and decodes in one call (the codec's cost term)."""
    g = groups_of(layout, rank)
    owners = min(len(r) for r in g.node_ranks)
    if len(g.node_ranks) == 1 or g.local >= owners:
        return 0
    total = 0
    for a, b in segments(count, codec.block):
        mine = slices(b - a, codec.block, len(g.node), owners)[g.local]
        chunk = chunks(mine, codec.block, len(g.rail))[g.rail_me]
        # code the slice, decode p chunks, code the chunk's sum, decode the slice
        total += 4 * (mine + len(g.rail) * chunk + chunk + mine)
    return total


def count_allreduce(c: Counts, g: Groups, rank: int, s: Shape, codec: Codec) -> None:
    """What ``allreduce`` sends and sums from ``rank`` (the rail's messages are coded).

    The segments' stages overlap in time; what is counted here is their sum.
    """
    recursive_doubling.count_allreduce(c, g.flat, rank, 2, 8)  # the agreement check
    owners = min(len(r) for r in g.node_ranks)
    for a, b in segments(s.count, codec.block):
        counts = slices(b - a, codec.block, len(g.node), owners)
        ring.count_reduce_scatter(c, g.node, g.local, counts, s.itemsize)
        if g.local < owners and len(g.rail) > 1:
            p, me = len(g.rail), g.rail_me
            parts = chunks(counts[g.local], codec.block, p)
            for j in range(p):
                if j != me:
                    c.send(codec.wire_bytes(parts[j]), False)
                    c.send(codec.wire_bytes(parts[me]), False)
            c.round(False, 2)
            c.reduced_bytes += (p - 1) * parts[me] * s.itemsize
        ring.count_allgather(c, g.node, g.local, counts, s.itemsize)


@functools.lru_cache(maxsize=64)
def record_for(codec: Codec) -> Algorithm:
    """The algorithm record of the compressed allreduce with ``codec`` (not in ``auto``'s table)."""

    def run(call: Call, buf: np.ndarray, op: object) -> Schedule:
        return allreduce(call, buf, op, codec)

    def counts(c: Counts, g: Groups, rank: int, s: Shape) -> None:
        count_allreduce(c, g, rank, s, codec)

    return Algorithm(
        name=f"compressed_{codec.name}",
        collective="allreduce",
        run=run,
        label=codec.name[:2].upper(),
        counts=counts,
        order=ORDER_NONE,
        hierarchical=True,
        senders=lambda layout, rank: min(len(r) for r in layout.node_ranks),
        summary=f"node reduce-scatter, {codec.scheme.summary} across nodes, node allgather",
    )
