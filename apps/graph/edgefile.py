"""Edge lists from files, each rank reading only its share: text, .npy and HDF5.

- text: one edge per line, ``u v`` or ``u v w`` (the same number of columns on every
  line), ``#`` or ``%`` starting a comment line, blank lines ignored; rank r parses the
  lines that start in bytes ``[r S / P, (r + 1) S / P)`` of the file.
- ``.npy``: an (m, 2) or (m, 3) numeric array (memory-mapped, never unpickled).
- ``.h5``/``.hdf5``: datasets ``src``, ``dst`` and optionally ``weight``, attribute
  ``n_vertices`` (what ``hpcpar graph generate --out`` writes).

Vertex ids must be integers in [0, n); n is ``n_vertices`` when given (or stored), else
the largest id + 1. Weights must be finite (1.0 when absent). Errors name the file, line
(or row) and the problem, and are raised on every rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from .graph import agree
from .kronecker import EdgeList, GraphError

__all__ = ["read_edges", "write_h5", "SUFFIXES"]

SUFFIXES = (".txt", ".el", ".tsv", ".csv", ".npy", ".h5", ".hdf5")


def read_edges(path: str | os.PathLike, comm: Any, n_vertices: int | None = None) -> EdgeList:
    """This rank's slice of the edge list in ``path`` (collective)."""
    path = Path(path)
    rank, size = comm.Get_rank(), comm.Get_size()
    if not path.is_file():
        raise GraphError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        src, dst, weight, stored = agree(comm, _read_npy, path, rank, size)
    elif suffix in (".h5", ".hdf5"):
        src, dst, weight, stored = agree(comm, _read_h5, path, rank, size)
    else:
        src, dst, weight, stored = agree(comm, _read_text, path, rank, size)
    m = comm.allreduce(src.size)
    first = comm.exscan(src.size) or 0
    if n_vertices is None:
        n_vertices = stored
    if n_vertices is None:
        top = max(int(src.max(initial=-1)), int(dst.max(initial=-1)))
        n_vertices = comm.allreduce(top, op=MPI.MAX) + 1
    if n_vertices < 1:
        raise GraphError(f"{path}: the graph has no vertices")
    edges = EdgeList(src, dst, weight, int(n_vertices), int(m), int(first))
    agree(comm, _check_range, path, edges)
    return edges


def _check_range(path: Path, edges: EdgeList) -> None:
    n = edges.n_vertices
    for x in (edges.src, edges.dst):
        bad = np.flatnonzero((x < 0) | (x >= n))
        if bad.size:
            raise GraphError(
                f"{path}: edge {edges.first + int(bad[0])} has vertex "
                f"{int(x[bad[0]])}, outside [0, {n})"
            )


def _columns(path: Path, data: np.ndarray, where: str) -> tuple[np.ndarray, ...]:
    if data.ndim != 2 or data.shape[1] not in (2, 3):
        raise GraphError(
            f"{path}: expected an (m, 2) or (m, 3) array of edges, not shape {data.shape}"
        )
    if data.dtype.kind not in "iuf":
        raise GraphError(f"{path}: edges must be numbers, not dtype {data.dtype}")
    ends = np.asarray(data[:, :2])
    if ends.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(ends).all(axis=1) | (ends != np.round(ends)).any(axis=1))
        if bad.size:
            raise GraphError(f"{path}: {where} {int(bad[0])}: vertex ids must be integers")
    src, dst = ends[:, 0].astype(np.int64), ends[:, 1].astype(np.int64)
    weight = np.asarray(data[:, 2], dtype=np.float64) if data.shape[1] == 3 else np.ones(src.size)
    bad = np.flatnonzero(~np.isfinite(weight))
    if bad.size:
        raise GraphError(f"{path}: {where} {int(bad[0])}: weight {weight[bad[0]]} is not finite")
    return src, dst, weight


def _read_npy(path: Path, rank: int, size: int) -> tuple:
    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise GraphError(f"{path}: not a readable .npy array ({exc})") from None
    if data.ndim != 2:
        raise GraphError(
            f"{path}: expected an (m, 2) or (m, 3) array of edges, not shape {data.shape}"
        )
    m = data.shape[0]
    lo, hi = m * rank // size, m * (rank + 1) // size
    src, dst, weight = _columns(path, data[lo:hi], "row")
    return src, dst, weight, None


def _read_h5(path: Path, rank: int, size: int) -> tuple:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in ("src", "dst") if k not in f]
            if missing:
                raise GraphError(f"{path}: no dataset {missing[0]!r} (expected src, dst, weight)")
            m = f["src"].shape[0]
            if f["dst"].shape != (m,) or ("weight" in f and f["weight"].shape != (m,)):
                raise GraphError(f"{path}: src, dst and weight must be 1-D of equal length")
            lo, hi = m * rank // size, m * (rank + 1) // size
            cols = [f["src"][lo:hi], f["dst"][lo:hi]]
            if "weight" in f:
                cols.append(f["weight"][lo:hi])
            stored = f.attrs.get("n_vertices")
    except OSError as exc:
        raise GraphError(f"{path}: not a readable HDF5 file ({exc})") from None
    src, dst, weight = _columns(
        path, np.stack(cols, axis=1) if cols[0].size else np.empty((0, len(cols))), "edge"
    )
    return src, dst, weight, None if stored is None else int(stored)


def _read_text(path: Path, rank: int, size: int) -> tuple:
    total = path.stat().st_size
    start, stop = total * rank // size, total * (rank + 1) // size
    with open(path, "rb") as f:
        if start:
            f.seek(start - 1)  # a line belongs to the rank where it starts
            if f.read(1) != b"\n":
                f.readline()
            start = f.tell()
        data = f.read(max(0, stop - start)) if start < stop else b""
        if data and not data.endswith(b"\n"):
            data += f.readline()
    lines = data.split(b"\n")
    src, dst, weight = [], [], []
    width = None
    for k, line in enumerate(lines):
        tokens = line.split()
        if not tokens or tokens[0][:1] in (b"#", b"%"):
            continue
        if len(tokens) not in (2, 3) or (width is not None and len(tokens) != width):
            want = "2 or 3" if width is None else str(width)
            raise GraphError(
                f"{path}:{_line_number(path, start, k)}: expected {want} "
                f"columns (u v [w]), found {len(tokens)}"
            )
        width = len(tokens)
        try:
            u, v = int(tokens[0]), int(tokens[1])
            w = float(tokens[2]) if width == 3 else 1.0
        except ValueError:
            raise GraphError(
                f"{path}:{_line_number(path, start, k)}: bad token in "
                f"{line.decode(errors='replace').strip()!r}"
            ) from None
        if not np.isfinite(w):
            raise GraphError(f"{path}:{_line_number(path, start, k)}: weight {w} is not finite")
        src.append(u)
        dst.append(v)
        weight.append(w)
    return (
        np.array(src, dtype=np.int64),
        np.array(dst, dtype=np.int64),
        np.array(weight, dtype=np.float64),
        None,
    )


def _line_number(path: Path, start: int, k: int) -> int:
    with open(path, "rb") as f:
        return f.read(start).count(b"\n") + k + 1


def write_h5(path: str | os.PathLike, edges: EdgeList, comm: Any, attrs: dict[str, Any]) -> None:
    """Write every rank's slice, in rank order, into one HDF5 file (rank 0 writes)."""
    import h5py

    parts = comm.gather((edges.src, edges.dst, edges.weight), root=0)
    if comm.Get_rank() == 0:
        tmp = Path(str(path) + ".tmp")
        with h5py.File(tmp, "w") as f:
            for k, name in enumerate(("src", "dst", "weight")):
                f.create_dataset(
                    name, data=np.concatenate([p[k] for p in parts]), chunks=True, fletcher32=True
                )
            f.attrs["n_vertices"] = edges.n_vertices
            for key, value in attrs.items():
                f.attrs[key] = value
        os.replace(tmp, path)
    comm.Barrier()
