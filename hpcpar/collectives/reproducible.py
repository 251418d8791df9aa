"""``reproducible=True``: results that are bitwise identical whatever the algorithm and layout.

Three cases, chosen by op and dtype:

- Exact already: integers and bools with any MPI op, MIN/MAX and the logical ops on
  floats. Any algorithm gives the same bits; it runs as it is.
- SUM of floats (and complex, part by part): pre-rounding to a grid set by the largest
  magnitude of each element (the ReproBLAS idea). Each value is cut into two integer
  limbs of 40 bits on the grid 2^(E-40), 2^(E-80), where 2^E bounds every rank's
  |value|; the limbs are summed exactly in int64 by the chosen algorithm, then turned
  back into one float. Integer sums do not depend on order, so the result depends
  only on the multiset of contributions: the same across algorithms, layouts, rank
  placement, and rank counts when the contributions are the same (ranks adding
  zeros change nothing). Cost: the data moves as 16 bytes per float element, plus an
  int32 MAX and an int8 OR allreduce (for the grid and for inf/nan). Accuracy: every
  contribution is rounded to 2^(E-80) before an exact sum, so the error is at most
  p * 2^(E-81): far below one ulp of the largest value for any practical p. Infinities
  and NaNs follow IEEE (inf + -inf is nan); a sum of negative zeros gives +0.0.
- Everything else (PROD of floats, numpy ufuncs, Python functions): every rank gathers
  all contributions and folds them in rank order 0, 1, ..., p-1. Identical across
  algorithms and layouts for the same rank count; costs p times the data per rank.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .algorithms import ALGORITHMS
from .call import Call
from .ops import ReduceOp, resolve_op
from .registry import LIBRARY, Algorithm
from .schedule import Schedule

__all__ = ["allreduce", "is_exact", "grid_exponent", "split_limbs", "join_limbs", "LIMB_BITS"]

LIMB_BITS = 40
_EXACT_OPS_ON_FLOATS = {"MIN", "MAX", "LAND", "LOR", "LXOR"}
_POSINF, _NEGINF, _NAN = 1, 2, 4
_ZERO_EXPONENT = -1100  # below the smallest subnormal's exponent (-1074)


def is_exact(op: ReduceOp, dtype: np.dtype) -> bool:
    """Whether ``op`` on ``dtype`` gives the same bits in any order."""
    if dtype.kind in "iub":
        return op.mpi_op is not None
    return op.name in _EXACT_OPS_ON_FLOATS and op.mpi_op is not None


def _float_sum(op: ReduceOp, dtype: np.dtype) -> bool:
    return (
        op.name == "SUM" and op.mpi_op is not None and dtype.kind in "fc" and dtype.itemsize <= 16
    )


def allreduce(call: Call, algorithm: Algorithm, buf: np.ndarray, op: ReduceOp) -> Schedule:
    """Reproducible allreduce of ``buf`` in place, built on ``algorithm``."""
    if is_exact(op, buf.dtype):
        yield from algorithm.run(call, buf, op)
    elif _float_sum(op, buf.dtype) and buf.dtype != np.longdouble:
        yield from _binned_sum(call, algorithm, buf)
    else:
        yield from _ordered_fold(call, buf, op)


def _run_exact(call: Call, algorithm: Algorithm, data: np.ndarray, mpi_op: MPI.Op) -> Schedule:
    yield from algorithm.run(call, data, resolve_op(mpi_op, data.dtype))


def grid_exponent(values: np.ndarray) -> np.ndarray:
    """Per element, E with |value| < 2^E.

    Zeros get an exponent below every float's, so ranks contributing zeros never move
    the grid.
    """
    exponent = np.frexp(values)[1].astype(np.int32)
    exponent[values == 0] = _ZERO_EXPONENT
    return exponent


def split_limbs(values: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """Cut float64 ``values`` into [hi, lo] int64 limbs on the grid set by ``exponent``."""
    hi = np.rint(np.ldexp(values, LIMB_BITS - exponent))
    rest = values - np.ldexp(hi, exponent - LIMB_BITS)  # exact: both lie on a common grid
    lo = np.rint(np.ldexp(rest, 2 * LIMB_BITS - exponent))
    return np.concatenate([hi, lo]).astype(np.int64)


def join_limbs(limbs: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """Turn summed [hi, lo] limbs back into float64 (carry first, so rounding is fixed)."""
    n = limbs.size // 2
    hi, lo = limbs[:n].copy(), limbs[n:].copy()
    carry = lo >> LIMB_BITS  # floor division by 2^40, also for negative lo
    hi += carry
    lo -= carry << LIMB_BITS
    return np.ldexp(hi.astype(np.float64), exponent - LIMB_BITS) + np.ldexp(
        lo.astype(np.float64), exponent - 2 * LIMB_BITS
    )


def _binned_sum(call: Call, algorithm: Algorithm, buf: np.ndarray) -> Schedule:
    parts = buf.view(buf.real.dtype) if buf.dtype.kind == "c" else buf  # complex: part by part
    values = parts.astype(np.float64)
    finite = np.isfinite(values)
    flags = np.where(np.isnan(values), _NAN, 0) | np.where(values == np.inf, _POSINF, 0)
    flags = (flags | np.where(values == -np.inf, _NEGINF, 0)).astype(np.int8)
    values[~finite] = 0.0
    exponent = grid_exponent(values)
    yield from _run_exact(call, algorithm, exponent, MPI.MAX)
    yield from _run_exact(call, algorithm, flags, MPI.BOR)
    limbs = split_limbs(values, exponent)
    yield from _run_exact(call, algorithm, limbs, MPI.SUM)
    total = join_limbs(limbs, exponent)
    total[(flags & _POSINF) != 0] = np.inf
    total[(flags & _NEGINF) != 0] = -np.inf
    total[((flags & _NAN) != 0) | (((flags & _POSINF) != 0) & ((flags & _NEGINF) != 0))] = np.nan
    parts[...] = total.astype(parts.dtype)


def _ordered_fold(call: Call, buf: np.ndarray, op: ReduceOp) -> Schedule:
    p, r = call.flat.size, call.flat.rank
    everyone = np.empty(p * buf.size, dtype=buf.dtype)
    everyone[r * buf.size : (r + 1) * buf.size] = buf
    gather = ALGORITHMS["allgather"][LIBRARY]
    yield from gather.run(call, everyone, [buf.size] * p)
    rows = everyone.reshape(p, buf.size)
    buf[...] = rows[0]
    for q in range(1, p):
        op.combine(buf, rows[q], buf)
    call.stats.reduced_bytes += buf.nbytes * (p - 1)
