"""Canonical layouts as MPI derived datatypes, built the way the MPI library walks fastest.

``Plan.to_mpi`` (zero-copy sends hand MPI hpcpar's own type of a layout, also in place of
a caller's datatype) resizes and commits what ``mpi_items`` builds.
"""

from __future__ import annotations

from mpi4py import MPI

from .ir import Item, Strided

__all__ = ["SPLIT_BELOW", "SPLIT_BLOCKS", "mpi_items"]


# blocks become vectors of the widest word that divides them, not runs of BYTEs, so
# the MPI library can copy them a word at a time
_MPI_WORDS = ((8, MPI.UINT64_T), (4, MPI.UINT32_T), (2, MPI.UINT16_T), (1, MPI.BYTE))


SPLIT_BLOCKS = 16  # long vectors of small blocks become vectors of this many blocks ...
SPLIT_BELOW = 1024  # ... when the blocks are smaller than this (bytes)


def _words_vector(named: MPI.Datatype, count: int, words: int, stride: int) -> MPI.Datatype:
    """``count`` blocks of ``words`` words ``stride`` words apart, as MPI walks it fastest.

    MPICH's datatype engine moves a long vector of small blocks several times faster
    when it is a vector of 16 blocks repeated than as one long vector (larger groups
    lose it again): the shape TEMPI found, that how a datatype is built matters as much
    as what it describes. Blocks of 1 KiB and more stay one vector. ``hpcpar bench
    datatypes`` (its send cases) measures it.
    """
    size = named.Get_size()
    if count <= SPLIT_BLOCKS or words * size >= SPLIT_BELOW:
        return named.Create_vector(count, words, stride)
    group = named.Create_vector(SPLIT_BLOCKS, words, stride)
    groups, tail = divmod(count, SPLIT_BLOCKS)
    whole = group.Create_hvector(groups, 1, SPLIT_BLOCKS * stride * size)
    group.Free()
    if not tail:
        return whole
    rest = named.Create_vector(tail, words, stride)
    both = MPI.Datatype.Create_struct(
        [1, 1], [0, groups * SPLIT_BLOCKS * stride * size], [whole, rest]
    )
    whole.Free()
    rest.Free()
    return both


def mpi_items(items: tuple[Item, ...]) -> MPI.Datatype:
    """A derived MPI datatype of ``items``, not committed (lower bound and extent as they fall).

    Blocks as vectors of words, built the way MPICH walks them fastest.
    """
    parts, displacements = [], []
    for item in items:
        if isinstance(item, Strided):
            word, named = next((w, t) for w, t in _MPI_WORDS if item.size % w == 0)
            dims = list(zip(item.counts, item.strides, strict=True))
            if dims and dims[-1][1] % word == 0:  # a vector of words: MPI's plainest type
                count, stride = dims.pop()
                dt = _words_vector(named, count, item.size // word, stride // word)
            else:
                dt = named.Create_contiguous(item.size // word)
            for count, stride in reversed(dims):
                outer = dt.Create_hvector(count, 1, stride)
                dt.Free()
                dt = outer
            parts.append(dt)
            displacements.append(item.offset)
        else:
            body = mpi_items(item.body)
            shaped = body.Create_resized(0, item.stride)
            body.Free()
            repeated = shaped.Create_contiguous(item.count)
            shaped.Free()
            parts.append(repeated)
            displacements.append(0)
    if not parts:
        return MPI.BYTE.Create_contiguous(0)
    if len(parts) == 1 and displacements[0] == 0:
        return parts[0]
    combined = MPI.Datatype.Create_struct([1] * len(parts), displacements, parts)
    for dt in parts:
        dt.Free()
    return combined
