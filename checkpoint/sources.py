"""Reading parts of a saved rank's arrays without the job that wrote them.

A resharding restore (``checkpoint.reshard``) needs, from each shard saved by the old
job, only the boxes of its arrays that overlap the new ranks' blocks. A ``Source`` reads
such a box from one saved rank's data at one level:

- ``ShardSource``: a shard file (the local or partner level's own file, a partner's
  copy, or a shard the XOR level rebuilds); it reads whole checksum blocks only
  (``checksum.BLOCK``, one per MiB) and verifies each, keeping one block at a time.
- a shard of a lost member of an XOR set, its bytes rebuilt on demand from the parity
  and the other members' shards (``parity.XorBytes``), range by range.
- ``H5Source``: a rank's HDF5 file (h5py reads only the chunks a box touches, and
  checks each with its Fletcher-32 sum).

``find_sources`` lists what this process can see of a version, per saved rank and level.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from . import checksum
from .naming import version_name
from .parity import XorBytes, fits
from .shard import TRAILER_BYTES, manifest_length, parse_manifest
from .state import CheckpointError

__all__ = ["Source", "ShardSource", "H5Source", "find_sources", "box_runs"]

_FILE = re.compile(r"^(rank|copy-rank)(\d+)\.(shard|parity|h5)$")


class _FileBytes:
    """A file's bytes by range (``pread``)."""

    def __init__(self, path: Path) -> None:
        self.where = str(path)
        try:
            self.fd = os.open(path, os.O_RDONLY)
            self.size = os.fstat(self.fd).st_size
        except OSError as exc:
            raise CheckpointError(f"{path}: {exc.strerror or 'unreadable'}") from None

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Fill the uint8 array ``out`` from ``start`` (zeros past the end of the file)."""
        view, got = memoryview(out), 0
        while got < len(view):
            try:
                n = os.preadv(self.fd, [view[got:]], start + got)
            except OSError as exc:
                raise CheckpointError(f"{self.where}: {exc.strerror or 'unreadable'}") from None
            if n == 0:
                break
            got += n
        out[got:] = 0

    def advise(self, start: int, n: int) -> None:
        """Ask the kernel to start reading these bytes (they will be read soon)."""
        with contextlib.suppress(OSError):
            os.posix_fadvise(self.fd, start, n, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        """Close the file."""
        os.close(self.fd)


def read_tail(raw: Any, step: int, rank: int, where: str) -> tuple[dict[str, Any], int]:
    """A shard's checked manifest entries and payload length, read from its end."""
    size = raw.size
    trailer = np.empty(TRAILER_BYTES, dtype=np.uint8)
    raw.read_into(max(0, size - TRAILER_BYTES), trailer)
    length, crc = manifest_length(trailer.tobytes() if size >= TRAILER_BYTES else b"", size, where)
    end = size - TRAILER_BYTES
    manifest = np.empty(length, dtype=np.uint8)
    raw.read_into(end - length, manifest)
    return parse_manifest(manifest.tobytes(), crc, end - length, step, rank, where), end - length


def box_runs(
    shape: tuple[int, ...], offset: tuple[int, ...], box: tuple[int, ...]
) -> tuple[int, np.ndarray]:
    """The contiguous runs of a box inside a C-ordered array, in the box's C order.

    Returns:
        ``(run length in elements, run starts as flat element indices of the array)``;
        the box's elements are the runs one after the other.
    """
    n = len(shape)
    if n == 0:
        return 1, np.zeros(1, dtype=np.int64)
    k, run = n - 1, box[n - 1]
    while k > 0 and box[k] == shape[k]:  # a full extent merges into the run
        k -= 1
        run *= box[k]
    strides = [math.prod(shape[i + 1 :]) for i in range(n)]
    base = sum(offset[i] * strides[i] for i in range(n))
    starts = np.zeros(1, dtype=np.int64) + base
    for i in range(k):
        steps = np.arange(box[i], dtype=np.int64) * strides[i]
        starts = (starts[:, None] + steps[None, :]).reshape(-1)
    return run, starts


READ_THREADS = 4  # threads reading one span of whole checksum blocks
_pool: list[Any] = []


def _readers() -> Any:
    """The helper threads of ``ShardSource`` (made on first use)."""
    if not _pool:
        from concurrent.futures import ThreadPoolExecutor

        _pool.append(ThreadPoolExecutor(READ_THREADS, thread_name_prefix="hpcpar-read"))
    return _pool[0]


class Source:
    """One saved rank's data at one level.

    Attributes:
        level: The level it is read from.
        entries: Name -> manifest entry (``value``, or ``dtype``/``shape`` of an array).
    """

    level = ""
    entries: dict[str, Any]

    def read_box(
        self, name: str, offset: tuple[int, ...], box: tuple[int, ...], out: np.ndarray
    ) -> None:
        """Fill ``out`` (C-contiguous, of shape ``box``) from array ``name`` at ``offset``.

        Raises:
            CheckpointError: the data is damaged (a checksum does not match).
        """
        raise NotImplementedError

    def prefetch(self, name: str, offset: tuple[int, ...], box: tuple[int, ...]) -> None:
        """Say that this box will be read: the kernel can fetch it while others are read."""

    def close(self) -> None:
        """Release the files."""


class ShardSource(Source):
    """A shard read by ranges; every block read is verified against its checksum."""

    def __init__(self, raw: Any, step: int, rank: int, level: str) -> None:
        self.raw, self.level, self.where = raw, level, raw.where
        try:
            self.entries, _ = read_tail(raw, step, rank, raw.where)
        except CheckpointError:
            raw.close()
            raise
        for entry in self.entries.values():
            if "value" not in entry:
                entry["dtype_obj"] = entry.pop("np_dtype")
        self._cached: tuple[str, int, np.ndarray] | None = None

    def _block(self, name: str, entry: dict[str, Any], k: int, size: int) -> np.ndarray:
        """Block ``k`` of array ``name``, read and verified (the last one is kept)."""
        if self._cached is not None and self._cached[:2] == (name, k):
            return self._cached[2]
        data = np.empty(min(size, entry["nbytes"] - k * size), dtype=np.uint8)
        self.raw.read_into(entry["offset"] + k * size, data)
        self._verify(name, entry, k, data)
        self._cached = (name, k, data)
        return data

    def _verify(self, name: str, entry: dict[str, Any], k: int, data: np.ndarray) -> None:
        blocks = checksum.block_digests(entry)
        if blocks is None:  # one checksum of the whole array (a small one): one block
            ok = checksum.matches(entry, data, self.where)
        else:
            ok = checksum.block_matches(blocks[0], blocks[1][k], data, self.where)
        if not ok:
            raise CheckpointError(f"{self.where}: checksum of {name!r} does not match")

    def _block_size(self, entry: dict[str, Any]) -> int:
        blocks = checksum.block_digests(entry)
        if blocks is None:
            return max(entry["nbytes"], 1)
        size = checksum.block_size(entry)
        if len(blocks[1]) != -(-entry["nbytes"] // size):
            raise CheckpointError(f"{self.where}: {entry!r:.40} has the wrong number of checksums")
        return size

    def prefetch(self, name: str, offset: tuple[int, ...], box: tuple[int, ...]) -> None:
        """Advise the bytes from the box's first run to its last."""
        entry = self.entries.get(name)
        if entry is None or "value" in entry or not math.prod(box):
            return
        itemsize = entry["dtype_obj"].itemsize
        run, starts = box_runs(tuple(entry["shape"]), offset, box)
        first, last = int(starts[0]) * itemsize, (int(starts[-1]) + run) * itemsize
        self.raw.advise(entry["offset"] + first, last - first)

    def read_box(
        self, name: str, offset: tuple[int, ...], box: tuple[int, ...], out: np.ndarray
    ) -> None:
        """Read the box's runs, whole verified blocks at a time."""
        entry = self.entries[name]
        itemsize = entry["dtype_obj"].itemsize
        run, starts = box_runs(tuple(entry["shape"]), offset, box)
        size = self._block_size(entry)
        flat = out.reshape(-1).view(np.uint8)
        length = run * itemsize
        for j, first in enumerate(starts.tolist()):
            self._span(name, entry, size, first * itemsize, flat[j * length : (j + 1) * length])

    def _span(
        self, name: str, entry: dict[str, Any], size: int, start: int, out: np.ndarray
    ) -> None:
        """Bytes ``start .. start + len(out)`` of an array, verified block by block.

        Whole blocks are read in place, several at once on ``READ_THREADS`` threads
        (reads and checksums let the GIL go): one rank restoring what several saved
        reads as fast as they did.
        """
        pos, end = start, start + out.size
        whole: list[tuple[int, np.ndarray]] = []
        while pos < end:
            k = pos // size
            lo, hi = k * size, min((k + 1) * size, entry["nbytes"])
            if pos == lo and hi <= end:  # a whole block: read it in place, no copy
                whole.append((k, out[pos - start : hi - start]))
            else:
                data = self._block(name, entry, k, size)
                take = min(end, hi) - pos
                out[pos - start : pos - start + take] = data[pos - lo : pos - lo + take]
            pos = min(end, hi)
        if len(whole) < 2:
            for k, target in whole:
                self._whole_block(name, entry, size, k, target)
            return
        step = -(-len(whole) // READ_THREADS)
        groups = [whole[i : i + step] for i in range(0, len(whole), step)]
        for done in _readers().map(lambda g: self._whole_blocks(name, entry, size, g), groups):
            if done:
                raise CheckpointError(done)

    def _whole_block(
        self, name: str, entry: dict[str, Any], size: int, k: int, target: np.ndarray
    ) -> None:
        self.raw.read_into(entry["offset"] + k * size, target)
        self._verify(name, entry, k, target)

    def _whole_blocks(
        self, name: str, entry: dict[str, Any], size: int, group: list[tuple[int, np.ndarray]]
    ) -> str:
        """Read whole blocks in order (on a helper thread); why they failed, or ""."""
        try:
            for k, target in group:
                self._whole_block(name, entry, size, k, target)
        except CheckpointError as exc:
            return str(exc)
        return ""

    def close(self) -> None:
        """Close the shard's file(s)."""
        self.raw.close()


class H5Source(Source):
    """A rank's HDF5 file; boxes are read with h5py (chunks checked by Fletcher-32)."""

    level = "hdf5"

    def __init__(self, path: Path, step: int, rank: int) -> None:
        import h5py

        from .levels.hdf5 import VALUES

        self.where = str(path)
        try:
            self.file = h5py.File(path, "r")
        except OSError as exc:
            raise CheckpointError(f"{path}: unreadable ({str(exc)[:80]})") from None
        try:
            f = self.file
            if (
                f.attrs.get("format") != "hpcpar-shard"
                or int(f.attrs.get("step", -1)) != step
                or int(f.attrs.get("rank", -1)) != rank
            ):
                raise CheckpointError(f"{path}: not version {step} of rank {rank}")
            values = json.loads(f.attrs[VALUES])
            if not isinstance(values, dict):
                raise CheckpointError(f"{path}: its values are not a table")
            self.entries = {k: {"value": v} for k, v in values.items()}
            found: list[tuple[str, Any]] = []
            f.visititems(lambda n, o: found.append((n, o)) if isinstance(o, h5py.Dataset) else None)
            for name, ds in found:
                if "hpcpar_dtype" in ds.attrs:
                    dtype = np.dtype(str(ds.attrs["hpcpar_dtype"]))
                    shape = [int(x) for x in ds.attrs["hpcpar_shape"]]
                else:
                    dtype, shape = ds.dtype, list(ds.shape)
                if dtype.hasobject:
                    raise CheckpointError(f"{path}: {name!r} asks for Python objects")
                self.entries[name] = {"dtype_obj": dtype, "shape": shape, "ds": ds}
        except CheckpointError:
            self.file.close()
            raise
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self.file.close()
            raise CheckpointError(f"{path}: unreadable ({str(exc).splitlines()[0][:80]})") from None

    def read_box(
        self, name: str, offset: tuple[int, ...], box: tuple[int, ...], out: np.ndarray
    ) -> None:
        """Read the box with h5py (raw-byte datasets run by run)."""
        entry = self.entries[name]
        ds = entry["ds"]
        try:
            if "hpcpar_dtype" in ds.attrs:
                itemsize = entry["dtype_obj"].itemsize
                run, starts = box_runs(tuple(entry["shape"]), offset, box)
                flat = out.reshape(-1).view(np.uint8)
                n = run * itemsize
                for j, first in enumerate(starts.tolist()):
                    flat[j * n : (j + 1) * n] = ds[first * itemsize : first * itemsize + n]
            elif box:
                where = tuple(slice(o, o + b) for o, b in zip(offset, box, strict=True))
                ds.read_direct(out, source_sel=where)
            else:
                out[()] = ds[()]
        except OSError as exc:  # Fletcher-32 mismatch, or an unreadable chunk
            raise CheckpointError(f"{self.where}: {name!r}: {str(exc)[:80]}") from None

    def prefetch(self, name: str, offset: tuple[int, ...], box: tuple[int, ...]) -> None:
        """Advise the whole file (HDF5 places chunks where it likes)."""
        with contextlib.suppress(OSError):
            fd = os.open(self.where, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Close the HDF5 file."""
        self.file.close()


def _listing(folder: Path) -> dict[tuple[str, int], Path]:
    """``(kind, rank) -> path`` of the files in one version folder."""
    out = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        match = _FILE.match(name)
        if match:
            kind = "copy" if match.group(1) == "copy-rank" else match.group(3)
            out[(kind, int(match.group(2)))] = folder / name
    return out


def find_sources(
    root: Path, local_dir: Path, step: int, ranks: int, levels: list[Any]
) -> dict[int, dict[str, Any]]:
    """What this process can see of version ``step``: saved rank -> level -> opener.

    An opener is a function returning a ``Source`` (or raising ``CheckpointError``);
    only levels in ``levels`` (classes, restore order) count. The XOR level offers a
    rank whose own file is gone when every other member of its set and the parity can
    be read.
    """
    found: dict[int, dict[str, Any]] = {r: {} for r in range(ranks)}
    vname = version_name(step)
    for cls in levels:
        files: dict[tuple[str, int], Path] = {}
        if cls.node_local:
            for node in sorted(local_dir.glob("node*")):
                files.update(_listing(node / cls.name / vname))
        else:
            files.update(_listing(root / cls.name / vname))
        if cls.name == "hdf5":
            for r in range(ranks):
                if ("h5", r) in files:
                    path = files[("h5", r)]
                    found[r][cls.name] = lambda p=path, r=r: H5Source(p, step, r)
            continue
        for r in range(ranks):
            path = files.get(("shard", r)) or files.get(("copy", r))
            if path is not None:
                found[r][cls.name] = _shard_opener(path, step, r, cls.name)
        if cls.name == "xor":
            _xor_openers(files, step, ranks, found)
    return found


def _shard_opener(path: Path, step: int, rank: int, level: str) -> Any:
    return lambda: ShardSource(_FileBytes(path), step, rank, level)


def _xor_openers(
    files: dict[tuple[str, int], Path], step: int, ranks: int, found: dict[int, dict[str, Any]]
) -> None:
    """Offer an XOR rebuild for each rank whose own shard is missing here."""
    sets: dict[int, dict[str, Any]] = {}
    for (kind, rank), path in files.items():
        if kind != "parity":
            continue
        try:
            raw = _FileBytes(path)
            try:
                entries, _ = read_tail(raw, step, rank, str(path))
            finally:
                raw.close()
        except CheckpointError:
            continue
        meta = {k: e.get("value") for k, e in entries.items() if "value" in e}
        members, lengths, chunk = meta.get("members"), meta.get("lengths"), meta.get("chunk")
        parity = entries.get("parity")
        if (
            fits(members, lengths, chunk)
            and rank in members
            and parity is not None
            and "value" not in parity
            and parity["nbytes"] == chunk
        ):
            sets[rank] = {
                "members": members,
                "lengths": lengths,
                "chunk": chunk,
                "parity": (path, parity["offset"]),
            }
    for rank in range(ranks):
        if ("shard", rank) in files:
            continue
        info = next((s for s in sets.values() if rank in s["members"]), None)
        if info is None:
            continue
        members = info["members"]
        others = [m for m in members if m != rank]
        if not all(("shard", m) in files and m in sets for m in others):
            continue
        found[rank]["xor"] = _xor_opener(files, sets, members, rank, step, info)


def _xor_opener(
    files: dict[tuple[str, int], Path],
    sets: dict[int, dict[str, Any]],
    members: list[int],
    rank: int,
    step: int,
    info: dict[str, Any],
) -> Any:
    def open_rebuild() -> Source:
        shards = {i: _FileBytes(files[("shard", m)]) for i, m in enumerate(members) if m != rank}
        parities = {
            i: (_FileBytes(sets[m]["parity"][0]), sets[m]["parity"][1])
            for i, m in enumerate(members)
            if m != rank
        }
        raw = XorBytes(members.index(rank), shards, parities, info["lengths"], info["chunk"])
        return ShardSource(raw, step, rank, "xor")

    return open_rebuild
