"""XOR parity's geometry, in one place for the level that writes it and the readers.

A set of ``m`` members cuts each member's shard into ``m - 1`` chunks of ``c`` bytes
(``chunk_length``: whole words, so the XOR runs a word at a time), zero-padded. Member
``j``'s parity is the XOR of one chunk of every other member ``i``: the one starting at
``chunk_start(i, j, m, c)``. So chunk ``t`` of member ``q`` is covered by the parity of
member ``covering(q, t, m)``, and a lost member is the XOR of, for each of its chunks,
that parity and the matching chunks of the others. ``XorBytes`` rebuilds a lost
member's bytes from files, range by range; ``levels.xor`` writes parity and rebuilds
with MPI reductions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["WORD", "chunk_length", "chunk_start", "covering", "fits", "XorBytes"]

WORD = 8  # parity chunks are whole 8-byte words (earlier versions wrote any length)


def chunk_length(lengths: list[int]) -> int:
    """The chunk length ``c`` of a set whose members' shards have these lengths."""
    return WORD * max(1, math.ceil(max(lengths) / (len(lengths) - 1) / WORD))


def chunk_start(i: int, j: int, m: int, c: int) -> int:
    """Where the chunk of member ``i``'s shard that member ``j``'s parity covers starts."""
    return ((j - i - 1) % m) * c


def covering(q: int, t: int, m: int) -> int:
    """The member whose parity covers chunk ``t`` of member ``q``."""
    return (q + t + 1) % m


def fits(members: Any, lengths: Any, chunk: Any) -> bool:
    """Whether a parity file's description is one a set could have written.

    Checked before a rebuild trusts it: the file may be damaged, crafted, or written
    with another ``xor_group`` (the sets then differ).
    """
    return (
        isinstance(members, list)
        and len(members) >= 2
        and isinstance(chunk, int)
        and not isinstance(chunk, bool)
        and chunk > 0
        and isinstance(lengths, list)
        and len(lengths) == len(members)
        and all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= chunk * (len(members) - 1)
            for n in lengths
        )
    )


class XorBytes:
    """Member ``lost``'s shard bytes, rebuilt from its XOR set's parity and survivors.

    Byte ``p`` of the lost member lies in its chunk ``t = p // c``; the parity of member
    ``j = (lost + t + 1) mod m`` covers it, together with byte ``p mod c`` of the chunk
    ``(j - i - 1) mod m`` of every other member ``i`` (``chunk_start``).

    Args:
        lost: The lost member's index in ``members``.
        shards: Member index -> its shard file's bytes (every member but ``lost``).
        parities: Member index -> ``(its parity file's bytes, where its parity starts)``.
        lengths: Every member's shard length.
        chunk: The chunk length ``c``.
    """

    def __init__(
        self,
        lost: int,
        shards: dict[int, Any],
        parities: dict[int, tuple[Any, int]],
        lengths: list[int],
        chunk: int,
    ) -> None:
        self.lost, self.shards, self.parities = lost, shards, parities
        self.lengths, self.chunk, self.m = lengths, chunk, len(lengths)
        self.size = lengths[lost]
        self.where = "XOR rebuild"

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Fill the uint8 array ``out`` with the lost shard's bytes from ``start``."""
        c, pos, end = self.chunk, start, start + out.size
        scratch = np.empty(min(out.size, c), dtype=np.uint8)
        while pos < end:
            t, s = divmod(pos, c)
            n = min(end, (t + 1) * c) - pos
            piece = out[pos - start : pos - start + n]
            j = covering(self.lost, t, self.m)
            if t >= self.m - 1 or j not in self.parities:
                piece[:] = 0
            else:
                source, at = self.parities[j]
                source.read_into(at + s, piece)
                for i, shard in self.shards.items():
                    if i == j:
                        continue
                    begin = chunk_start(i, j, self.m, c) + s
                    part = scratch[:n]
                    if begin >= self.lengths[i]:
                        continue  # past the member's end: zeros, XOR's identity
                    shard.read_into(begin, part)  # zeros past the member's end
                    np.bitwise_xor(piece, part, out=piece)
            pos += n

    def advise(self, start: int, n: int) -> None:
        """Ask the kernel to start reading the files a rebuild reads (whole)."""
        del start, n
        for shard in self.shards.values():
            shard.advise(0, 0)
        for source, _ in self.parities.values():
            source.advise(0, 0)

    def close(self) -> None:
        """Close the files read."""
        for shard in self.shards.values():
            shard.close()
        for source, _ in self.parities.values():
            source.close()
