"""``hpcpar checkpoint export``: one version as one plain HDF5 file of global arrays.

Sharded leaves are assembled into their global shape, replicated ones written once,
per-rank arrays stacked along a leading rank axis (or, when their shapes or dtypes
differ, kept as ``<leaf>/rank<R>``). Plain values become attributes: each scalar under
its leaf name, and all of them (per-rank ones as lists) as JSON in ``hpcpar_metadata``;
the step, the number of ranks that saved it and the state's tree description too (a
value whose name is one of these file attributes is written as ``state/<name>``). The
file needs only h5py to read.

The file is written to a temporary name beside ``to`` and renamed into place. ``to``
must lie outside the checkpoint's folders, and may replace only a regular file, and
that only with ``force``: an export never touches the checkpoint it reads, a device or
a folder. It is read with the resharding machinery, so each
sharded leaf streams from the shards into its dataset piece by piece, from whichever
level holds the data whole.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from .inspect import scan
from .levels import LEVELS
from .reshard import restore_resharded
from .state import LAYOUT, TREE, CheckpointError

__all__ = ["export", "FILE_ATTRIBUTES"]

FILE_ATTRIBUTES = ("step", "ranks", "hpcpar_metadata", "hpcpar_tree")  # the export's own


def _check_target(to: Path, folders: list[Path], force: bool) -> None:
    """Refuse a ``to`` inside the checkpoint, or over anything but a regular file."""
    where = to.resolve()
    for folder in folders:
        inside = folder.resolve()
        if where == inside or inside in where.parents:
            raise CheckpointError(
                f"--to {to}: inside the checkpoint's folder {folder}; export to a file outside it"
            )
    try:
        mode = os.stat(to).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CheckpointError(f"--to {to}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"--to {to}: exists and is not a regular file; export writes files")
    if not force:
        raise CheckpointError(f"--to {to}: exists; pass --force to replace it")


def export(
    root: Path,
    to: Path,
    step: int | None = None,
    local_dir: Path | None = None,
    force: bool = False,
) -> int:
    """Write version ``step`` (default: the newest committed) of ``root`` to ``to``.

    Args:
        root: the checkpoint's folder.
        to: the HDF5 file to write, outside ``root`` and ``local_dir``.
        step: the version; None for the newest committed.
        local_dir: node-local storage, if not ``root/nodes``.
        force: replace ``to`` if it is an existing regular file.

    Returns:
        The version written.

    Raises:
        CheckpointError: no such version, damaged beyond repair, ``to`` inside the
            checkpoint, existing (without ``force``) or not a regular file, or not
            writable (nothing is left at ``to`` then, and nothing changed there).
    """
    import h5py
    from mpi4py import MPI

    to = Path(to)
    folders = [Path(root)] + ([Path(local_dir)] if local_dir is not None else [])
    _check_target(to, folders, force)
    info = scan(root, local_dir)
    committed = {lv: set(e["committed"]) for lv, e in info["levels"].items()}
    every = sorted({s for steps in committed.values() for s in steps}, reverse=True)
    if not every:
        raise CheckpointError(f"{root}: no committed version to export")
    version = every[0] if step is None else step
    if version not in every:
        raise CheckpointError(f"{root}: version {version} is not committed at any level")
    levels = [LEVELS[n] for n in LEVELS if version in committed.get(n, ())]
    ranks = info["versions"].get(version, info["ranks"])
    tmp = to.with_name(f".{to.name}.tmp")
    try:
        with h5py.File(tmp, "w") as f:
            flat, _ = restore_resharded(
                MPI.COMM_SELF,
                root,
                Path(local_dir) if local_dir is not None else root / "nodes",
                version,
                ranks,
                levels,
                reshard=lambda name, shape: ((0,) * len(shape), tuple(shape)),
                per_rank="all",
                alloc=_allocator(f),
            )
            _finish(f, flat, version, ranks)
        os.replace(tmp, to)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"{to}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return version


def _allocator(f: Any) -> Any:
    """Datasets for sharded and replicated leaves; per-rank arrays in memory first."""

    def alloc(key: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        if isinstance(key, tuple):  # a per-rank array: stacked (or not) once all are read
            return np.empty(shape, dtype)
        try:
            return f.create_dataset(key, shape=shape, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{key!r}: cannot be stored in HDF5 ({exc})") from None

    return alloc


def _finish(f: Any, flat: dict[str, Any], step: int, ranks: int) -> None:
    """Write the per-rank arrays and the attributes."""
    metadata = {}
    for name, value in flat.items():
        if name.startswith("."):
            continue
        if isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
            if len({(v.shape, v.dtype.str) for v in value}) == 1:
                f.create_dataset(name, data=np.stack(value))
            else:
                for r, array in enumerate(value):
                    f.create_dataset(f"{name}/rank{r}", data=array)
        elif not isinstance(value, np.ndarray) and not hasattr(value, "shape"):
            metadata[name] = value
            attribute = f"state/{name}" if name in FILE_ATTRIBUTES else name
            if isinstance(value, bool):
                f.attrs[attribute] = np.bool_(value)
            elif isinstance(value, (float, str)) or (
                isinstance(value, int) and -(1 << 63) <= value < 1 << 63
            ):
                f.attrs[attribute] = value  # (None, lists and huge ints: in hpcpar_metadata)
    layouts = {k[len(LAYOUT) :]: json.loads(v) for k, v in flat.items() if k.startswith(LAYOUT)}
    for name, layout in layouts.items():
        if name in f:
            f[name].attrs["hpcpar_layout"] = layout.get("kind", "")
    f.attrs["step"], f.attrs["ranks"] = step, ranks
    f.attrs["hpcpar_metadata"] = json.dumps(metadata)
    if TREE in flat:
        f.attrs["hpcpar_tree"] = flat[TREE]
