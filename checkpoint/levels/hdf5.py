"""The HDF5 level: the parallel-file-system copy, readable by any HDF5 tool.

h5py here is built without MPI, so each rank writes ``hdf5/v<step>/rank<R>.h5`` (arrays as
chunked datasets with Fletcher-32 checksums and a CRC-32 attribute, values as JSON in an
attribute) and rank 0 writes ``index.h5`` with an external link per rank, so one file
opens the whole version. Files are written under a temporary name, fsynced and renamed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .. import checksum
from ..shard import EncodedShard, fsync_dir
from ..state import CheckpointError
from .base import Level

__all__ = ["Hdf5Level", "write_h5", "read_h5", "VALUES"]

VALUES = "hpcpar_values"


def _bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def write_h5(path: Path, step: int, rank: int, flat: dict[str, Any]) -> None:
    """Write one rank's state as an HDF5 file, durably and atomically.

    Raises:
        OSError: the write failed.
    """
    import h5py

    from ..armed import check_write

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        check_write(path)
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = "hpcpar-shard"
            f.attrs["step"], f.attrs["rank"] = step, rank
            values = {}
            for name, value in sorted(flat.items()):
                if not isinstance(value, np.ndarray):
                    values[name] = value
                    continue
                array = np.ascontiguousarray(value)
                filters = {"chunks": True, "fletcher32": True} if array.ndim and array.size else {}
                try:
                    ds = f.create_dataset(name, data=array, **filters)
                except (TypeError, ValueError):  # a dtype HDF5 lacks: keep the raw bytes
                    ds = f.create_dataset(name, data=array.reshape(-1).view(np.uint8))
                    ds.attrs["hpcpar_dtype"] = array.dtype.str
                    ds.attrs["hpcpar_shape"] = list(array.shape)
                ds.attrs[checksum.KEY] = checksum.digest(_bytes(array))
            f.attrs[VALUES] = json.dumps(values)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def read_h5(path: Path, step: int, rank: int) -> dict[str, Any]:
    """Read and verify one rank's HDF5 file.

    Raises:
        CheckpointError: missing, truncated or corrupted (Fletcher-32 or CRC-32).
    """
    import h5py

    flat: dict[str, Any] = {}
    try:
        with h5py.File(path, "r") as f:
            if (
                f.attrs.get("format") != "hpcpar-shard"
                or int(f.attrs.get("step", -1)) != step
                or int(f.attrs.get("rank", -1)) != rank
            ):
                raise CheckpointError(f"{path}: not version {step} of rank {rank}")
            flat.update(json.loads(f.attrs[VALUES]))
            datasets: list[tuple[str, Any]] = []
            f.visititems(
                lambda n, o: datasets.append((n, o)) if isinstance(o, h5py.Dataset) else None
            )
            for name, ds in datasets:
                array = ds[()]
                if "hpcpar_dtype" in ds.attrs:
                    dtype = np.dtype(str(ds.attrs["hpcpar_dtype"]))
                    if dtype.hasobject:
                        raise CheckpointError(f"{path}: {name!r} asks for Python objects")
                    array = array.view(dtype).reshape([int(x) for x in ds.attrs["hpcpar_shape"]])
                array = np.asarray(array)
                record = {k: str(v) for k, v in ds.attrs.items() if k in ("crc32", "crc32c")}
                if not checksum.matches(record, _bytes(array), str(path)):
                    raise CheckpointError(f"{path}: checksum of {name!r} does not match")
                flat[name] = array
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable ({str(exc).splitlines()[0][:120]})") from None
    return flat


class Hdf5Level(Level):
    """``root/hdf5/v<step>/rank<R>.h5`` plus ``index.h5`` (external links)."""

    name = "hdf5"
    survives = "the loss of every node's storage (the shared file system keeps it)"
    recyclable = False  # h5py writes its own files: a spare would never be written over
    node_local = False  # in the shared root, not on a node
    own_kind = "h5"

    @classmethod
    def read(cls, path: Path, step: int, rank: int) -> dict[str, Any]:
        """Read and verify a rank's HDF5 file."""
        return read_h5(path, step, rank)

    def own_path(self, step: int) -> Path:
        """This rank's HDF5 file."""
        return self.version_dir(step) / f"rank{self.job.rank}.h5"

    def write(
        self, step: int, shard: EncodedShard, flat: dict[str, Any], written: dict[str, Path]
    ) -> str:
        """Write this rank's HDF5 file."""
        try:
            write_h5(self.own_path(step), step, self.job.rank, flat)
        except OSError as exc:
            return f"rank {self.job.rank}: {exc.strerror or exc}"
        written[self.name] = self.own_path(step)
        return ""

    def on_commit(self, step: int) -> None:
        """Rank 0: ``index.h5`` linking every rank's file."""
        import h5py

        folder = self.version_dir(step)
        tmp = folder / ".index.h5.tmp"
        with h5py.File(tmp, "w") as f:
            f.attrs["step"], f.attrs["ranks"] = step, self.job.size
            for rank in range(self.job.size):
                f[f"rank{rank}"] = h5py.ExternalLink(f"rank{rank}.h5", "/")
        os.replace(tmp, folder / "index.h5")
        fsync_dir(folder)

    def recover(self, step: int, need: bool) -> tuple[dict[str, Any] | None, str]:
        """Read this rank's HDF5 file."""
        if not need:
            return None, ""
        try:
            return read_h5(self.own_path(step), step, self.job.rank), ""
        except CheckpointError as exc:
            return None, str(exc)

    def remove(self, step: int) -> None:
        """Delete this rank's file (rank 0 also the index)."""
        if self.job.rank == 0:
            (self.version_dir(step) / "index.h5").unlink(missing_ok=True)
        super().remove(step)


LEVEL = Hdf5Level  # what levels/__init__.py registers
