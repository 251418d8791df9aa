"""Shared test data for the collectives tests: contributions every rank can recompute."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

AFFINE = np.dtype([("m", "f8"), ("c", "f8")])


def affine(a, b):
    """Composition of affine maps x -> m*x + c: associative, not commutative."""
    out = np.empty_like(a)
    out["m"] = a["m"] * b["m"]
    out["c"] = a["c"] * b["m"] + b["c"]
    return out


def contribution(rank: int, n: int, dtype, seed: int = 0) -> np.ndarray:
    """Rank ``rank``'s data: small integers so every reduction order is exact."""
    rng = np.random.default_rng([seed, rank, n])
    dtype = np.dtype(dtype)
    if dtype == AFFINE:
        out = np.empty(n, AFFINE)
        out["m"] = rng.integers(1, 3, n)
        out["c"] = rng.integers(-3, 4, n)
        return out
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dtype.kind == "u":
        return rng.integers(0, 200, n).astype(dtype)
    if dtype.kind == "c":
        return (rng.integers(-3, 4, n) + 1j * rng.integers(-3, 4, n)).astype(dtype)
    low = 1 if dtype.kind == "f" else -3
    return rng.integers(low, 4, n).astype(dtype)


def fold(op, parts: list[np.ndarray]) -> np.ndarray:
    """Reference: reduce the parts in rank order with numpy."""
    funcs = {
        "SUM": np.add,
        "PROD": np.multiply,
        "MIN": np.minimum,
        "MAX": np.maximum,
        "LAND": np.logical_and,
        "LOR": np.logical_or,
        "LXOR": np.logical_xor,
        "BAND": np.bitwise_and,
        "BOR": np.bitwise_or,
        "BXOR": np.bitwise_xor,
    }
    acc = parts[0].copy()
    for part in parts[1:]:
        if isinstance(op, MPI.Op):
            name = next(k for k in funcs if getattr(MPI, k) == op)
            result = funcs[name](acc, part)
            acc = result.astype(acc.dtype) if name.startswith("L") else result
        elif isinstance(op, np.ufunc):
            acc = op(acc, part)
        else:
            acc = op(acc, part)
    return acc


# (op, dtype, commutative) cases covering every dtype family
REDUCTION_CASES = [
    (MPI.SUM, "f8", True),
    (MPI.SUM, "i4", True),
    (MPI.PROD, "c16", True),
    (MPI.MIN, "f4", True),
    (MPI.MAX, "i8", True),
    (MPI.LAND, "?", True),
    (MPI.LOR, "i2", True),
    (MPI.LXOR, "?", True),
    (MPI.BAND, "u1", True),
    (MPI.BOR, "u8", True),
    (MPI.BXOR, "i4", True),
    (MPI.SUM, "f2", True),
    (np.maximum, "f8", True),
    (affine, AFFINE, False),
]
