"""Writing and reading one rank's shard: .npy files, a checksummed manifest, atomic renames."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from .state import CheckpointError

__all__ = ["write_shard", "read_shard", "fsync_dir", "write_atomic"]

MANIFEST = "manifest.json"


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write a small file durably and atomically (temporary file, fsync, rename, fsync dir)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_shard(target: Path, step: int, rank: int, flat: dict[str, Any]) -> None:
    """Write ``flat`` into ``target`` atomically: a temporary directory renamed into place."""
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    entries: dict[str, Any] = {}
    for i, (name, value) in enumerate(sorted(flat.items())):
        if isinstance(value, np.ndarray):
            file = f"a{i:06d}.npy"
            with open(tmp / file, "wb") as handle:
                np.save(handle, value, allow_pickle=False)
                handle.flush()
                os.fsync(handle.fileno())
            entries[name] = {
                "array": file,
                "sha256": _sha256(tmp / file),
                "dtype": value.dtype.str,
                "shape": list(value.shape),
            }
        else:
            entries[name] = {"value": value}
    write_atomic(
        tmp / MANIFEST,
        json.dumps({"format": "hpcpar-shard", "step": step, "rank": rank, "entries": entries}),
    )
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def read_shard(target: Path, step: int, rank: int) -> dict[str, Any]:
    """Read and verify a shard (checksums, shapes, dtypes); never unpickles anything.

    Raises:
        CheckpointError: missing, truncated or corrupted, naming what is wrong.
    """
    try:
        doc = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{target}: manifest unreadable ({exc.__class__.__name__})") from None
    if doc.get("format") != "hpcpar-shard" or doc.get("step") != step or doc.get("rank") != rank:
        raise CheckpointError(f"{target}: manifest is for another version or rank")
    flat: dict[str, Any] = {}
    for name, entry in doc.get("entries", {}).items():
        if "value" in entry:
            flat[name] = entry["value"]
            continue
        path = target / str(entry.get("array", ""))
        if path.parent != target or not path.is_file():
            raise CheckpointError(f"{target}: array file of {name!r} is missing")
        if _sha256(path) != entry.get("sha256"):
            raise CheckpointError(f"{target}: checksum of {name!r} does not match")
        array = np.load(path, allow_pickle=False)
        if array.dtype.str != entry.get("dtype") or list(array.shape) != entry.get("shape"):
            raise CheckpointError(f"{target}: {name!r} has the wrong dtype or shape")
        flat[name] = array
    return flat
