"""One rank's shard of a version as a single self-checking file.

Layout: the arrays' bytes (each 64-byte aligned), then a JSON manifest (one CRC-32C per
array, its dtype, shape and offset; numbers and strings inline), then a 24-byte trailer
(magic, manifest length, CRC-32 of the manifest). A truncated file loses its trailer, a
flipped byte breaks a checksum, so a damaged shard is always detected, never decoded into
a wrong array. Nothing is unpickled: dtypes with Python objects are refused.

The same bytes are written to a node's local directory, sent to a partner, XOR-ed into
parity, so every level verifies what it rebuilds the same way.
"""

from __future__ import annotations

import errno
import json
import math
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from . import checksum
from .armed import at_half, check_write
from .state import CheckpointError

__all__ = [
    "EncodedShard",
    "encode_shard",
    "decode_shard",
    "write_file",
    "read_file",
    "manifest_length",
    "parse_manifest",
    "TRAILER_BYTES",
    "fsync_dir",
    "write_atomic",
]

MAGIC = b"HPCPARS1"
_TRAILER = struct.Struct("<8sQI4x")
_ALIGN = 64
_PAD = bytes(_ALIGN)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write a small file durably and atomically (temporary file, fsync, rename, fsync dir).

    Raises:
        OSError: the write failed; the temporary file is removed, ``path`` is untouched.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # nothing half-written is left visible
        raise
    fsync_dir(path.parent)


class EncodedShard:
    """A shard ready to write or send.

    The array bytes (``body``) can be written at once; the manifest with their CRC-32Cs is
    computed on a helper thread meanwhile (hashing releases the GIL), and ``tail()`` waits
    for it, so checksumming overlaps with writing.

    Attributes:
        step, rank: The version and the rank it belongs to.
        body: The arrays' bytes and alignment padding, in file order.
        body_nbytes: Their total length.
    """

    def __init__(self, step: int, rank: int, entries: dict[str, Any], body: list[Any]) -> None:
        self.step, self.rank, self.body = step, rank, body
        self.body_nbytes = sum(memoryview(s).nbytes for s in body)
        self._entries = entries
        self._tail: bytes | None = None
        self._digests: list[dict[str, Any]] = []
        arrays = [entries[n]["raw"] for n in sorted(entries) if "raw" in entries[n]]
        self._hasher = threading.Thread(target=_hash_all, args=(arrays, self._digests))
        self._hasher.start()

    def tail(self) -> bytes:
        """The manifest and trailer (waits for the checksums)."""
        if self._tail is None:
            self._hasher.join()
            entries = {}
            names = iter(self._digests)
            for name in sorted(self._entries):
                entry = dict(self._entries[name])
                if entry.pop("raw", None) is not None:
                    entry.update(next(names))
                entries[name] = entry
            manifest = json.dumps(
                {
                    "format": "hpcpar-shard",
                    "step": self.step,
                    "rank": self.rank,
                    "entries": entries,
                },
                separators=(",", ":"),
            ).encode()
            self._tail = manifest + _TRAILER.pack(MAGIC, len(manifest), zlib.crc32(manifest))
        return self._tail

    def hashed(self) -> bool:
        """Whether the checksums are done (``tail()`` would not wait)."""
        return self._tail is not None or not self._hasher.is_alive()

    @property
    def nbytes(self) -> int:
        """The file's length."""
        return self.body_nbytes + len(self.tail())

    def join(self) -> np.ndarray:
        """The file's bytes as one uint8 array."""
        out = np.empty(self.nbytes, dtype=np.uint8)
        self.read_into(0, out)
        return out

    def segments(self) -> Any:
        """The file's bytes in order: the body's buffers, then the tail."""
        return _segments(self)

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Copy the file's bytes from ``start`` into the uint8 array ``out``, zeros past its end."""
        pos, end = 0, start + out.size
        for seg in self.segments():
            if pos >= end:
                break
            view = np.frombuffer(memoryview(seg).cast("B"), dtype=np.uint8)
            lo, hi = max(start, pos), min(end, pos + view.size)
            if lo < hi:
                out[lo - start : hi - start] = view[lo - pos : hi - pos]
            pos += view.size
        out[max(0, min(pos, end) - start) :] = 0


def _hash_all(arrays: list[np.ndarray], out: list[dict[str, Any]]) -> None:
    out.extend(checksum.digest_array(a) for a in arrays)


def encode_shard(step: int, rank: int, flat: dict[str, Any]) -> EncodedShard:
    """Lay out ``flat`` (name -> array or JSON value) as a shard; hashing starts at once."""
    entries: dict[str, Any] = {}
    body: list[Any] = []
    offset = 0
    for name, value in sorted(flat.items()):
        if isinstance(value, np.ndarray):
            array = np.ascontiguousarray(value)
            raw = array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
            entries[name] = {
                "offset": offset,
                "nbytes": int(array.nbytes),
                "dtype": array.dtype.str if not array.dtype.fields else array.dtype.descr,
                "shape": list(array.shape),
                "raw": raw,
            }
            body.append(raw)
            offset += array.nbytes
            pad = -offset % _ALIGN
            if pad:
                body.append(_PAD[:pad])
                offset += pad
        else:
            entries[name] = {"value": value}
    return EncodedShard(step, rank, entries, body)


_SCALARS = (type(None), bool, int, float, str)
_MAX_DIMS = 64


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entry(name: Any, entry: Any, where: str) -> None:
    """Refuse a manifest entry of the wrong shape (a crafted or damaged file), naming it.

    Raises:
        CheckpointError: what is wrong with the entry.
    """
    if not isinstance(name, str) or not isinstance(entry, dict):
        raise CheckpointError(f"{where}: manifest entry {name!r} is not a table")
    if "value" in entry:
        value = entry["value"]
        flat_list = isinstance(value, list) and all(isinstance(v, _SCALARS) for v in value)
        if not (isinstance(value, _SCALARS) or flat_list):
            raise CheckpointError(f"{where}: {name!r} holds a value of an unknown kind")
        return
    shape = entry.get("shape")
    if not (
        _count(entry.get("offset"))
        and _count(entry.get("nbytes"))
        and isinstance(shape, list)
        and len(shape) <= _MAX_DIMS
        and all(_count(n) for n in shape)
    ):
        raise CheckpointError(f"{where}: {name!r} has a bad offset, size or shape")
    if not isinstance(entry.get("dtype"), (str, list)):
        raise CheckpointError(f"{where}: {name!r} has an unknown dtype")
    blocks = checksum.block_digests(entry)
    if blocks is not None:
        if not (checksum.block_size(entry) and all(isinstance(d, str) for d in blocks[1])):
            raise CheckpointError(f"{where}: {name!r} has bad block checksums")
    elif not any(isinstance(entry.get(k), str) for k in ("crc32c", "crc32")):
        raise CheckpointError(f"{where}: {name!r} has no checksum")


def _dtype(spec: Any, name: str, where: str) -> np.dtype:
    try:
        dtype = np.dtype(spec if isinstance(spec, str) else [tuple(f) for f in spec])
    except (TypeError, ValueError, RecursionError):
        raise CheckpointError(f"{where}: {name!r} has an unknown dtype") from None
    if dtype.hasobject:
        raise CheckpointError(f"{where}: {name!r} asks for Python objects (refused)")
    return dtype


def manifest_length(trailer: bytes, size: int, where: str) -> tuple[int, int]:
    """``(manifest length, its CRC-32)`` from a shard's last ``TRAILER_BYTES`` bytes.

    Raises:
        CheckpointError: truncated or not a shard.
    """
    if size < _TRAILER.size or len(trailer) != _TRAILER.size:
        raise CheckpointError(f"{where}: truncated ({size} bytes)")
    magic, length, crc = _TRAILER.unpack(trailer)
    if magic != MAGIC or length > size - _TRAILER.size:
        raise CheckpointError(f"{where}: truncated or not a shard (no trailer)")
    return length, crc


def parse_manifest(
    manifest: bytes, crc: int, payload: int, step: int, rank: int, where: str
) -> dict[str, dict[str, Any]]:
    """A shard's manifest entries, each checked (offsets inside the ``payload`` bytes).

    Raises:
        CheckpointError: a damaged or crafted manifest, or one of another version or rank.
    """
    if zlib.crc32(manifest) != crc:
        raise CheckpointError(f"{where}: manifest checksum does not match")
    try:
        doc = json.loads(manifest)
    except (ValueError, RecursionError):
        raise CheckpointError(f"{where}: manifest unreadable") from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != "hpcpar-shard"
        or doc.get("step") != step
        or doc.get("rank") != rank
    ):
        raise CheckpointError(f"{where}: manifest is for another version or rank")
    entries = doc.get("entries", {})
    if not isinstance(entries, dict):
        raise CheckpointError(f"{where}: manifest entries are not a table")
    for name, entry in entries.items():
        _check_entry(name, entry, where)
        if "value" in entry:
            continue
        dtype = _dtype(entry["dtype"], name, where)
        offset, nbytes, shape = entry["offset"], entry["nbytes"], entry["shape"]
        if offset + nbytes > payload:
            raise CheckpointError(f"{where}: {name!r} lies outside the file")
        if math.prod(shape) * dtype.itemsize != nbytes:
            raise CheckpointError(f"{where}: {name!r} has the wrong size for its shape")
        entry["np_dtype"] = dtype
    return entries


def decode_shard(
    data: np.ndarray, step: int, rank: int, where: str = "shard", verify: bool = True
) -> dict[str, Any]:
    """Check and unpack a shard's bytes (uint8 array); arrays are views into ``data``.

    Raises:
        CheckpointError: truncated, corrupted, or a shard of another version or rank.
    """
    length, crc = manifest_length(data[-_TRAILER.size :].tobytes(), data.size, where)
    end = data.size - _TRAILER.size
    payload = end - length
    entries = parse_manifest(data[payload:end].tobytes(), crc, payload, step, rank, where)
    flat: dict[str, Any] = {}
    for name, entry in entries.items():
        if "value" in entry:
            flat[name] = entry["value"]
            continue
        dtype, offset, nbytes, shape = (
            entry["np_dtype"],
            entry["offset"],
            entry["nbytes"],
            entry["shape"],
        )
        raw = data[offset : offset + nbytes]
        if verify and not checksum.matches(entry, raw, where):
            raise CheckpointError(f"{where}: checksum of {name!r} does not match")
        flat[name] = raw.view(dtype).reshape(shape) if nbytes else np.zeros(shape, dtype)
    return flat


TRAILER_BYTES = _TRAILER.size


# ---- files ---------------------------------------------------------------------------

_CHUNK = 64 << 20


def write_file(path: Path, shard: EncodedShard, reuse: Path | None = None) -> None:
    """Write a shard durably and atomically: temporary file, fsync, rename, fsync dir.

    Args:
        path: The file to create (replaced if it exists).
        shard: What to write.
        reuse: A spare file (an old version's, no other links) to write over instead of
            allocating a new one, if it exists (same file system). Overwriting blocks a
            file already owns skips the file system's allocation and, on thin-provisioned
            virtual disks, the host's: the reason PostgreSQL recycles its WAL segments.

    Raises:
        OSError: the write failed (the temporary file is removed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    half, written = shard.body_nbytes // 2, 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    if reuse is not None:
        try:
            os.replace(reuse, tmp)  # claims the spare; its old bytes are overwritten below
            flags &= ~os.O_TRUNC
        except OSError:
            pass  # no spare (or another file system): a new file
    try:
        fd = os.open(tmp, flags, 0o644)
        try:
            check_write(path)
            for seg in _segments(shard, fd):  # the tail (which waits for the hashes) last
                view = memoryview(seg).cast("B")
                for start in range(0, max(len(view), 1), _CHUNK):
                    piece = view[start : start + _CHUNK]
                    while len(piece):
                        n = os.write(fd, piece)
                        if n == 0:
                            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                        piece, written = piece[n:], written + n
                    if written >= half:
                        at_half()
                        half = 1 << 62
            if not flags & os.O_TRUNC:
                os.ftruncate(fd, written)  # a longer spare's old tail would hide the trailer
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


_EARLY_SYNC = 64 << 20


def _segments(shard: EncodedShard, fd: int | None = None) -> Any:
    yield from shard.body
    if fd is not None and shard.body_nbytes >= _EARLY_SYNC and not shard.hashed():
        os.fdatasync(fd)  # the disk takes the body while the checksums finish
    yield shard.tail()


def read_file(path: Path, step: int, rank: int) -> dict[str, Any]:
    """Read and verify a shard file.

    Raises:
        CheckpointError: missing, truncated or corrupted, naming what is wrong.
    """
    return decode_shard(read_bytes(path), step, rank, where=str(path))


def read_bytes(path: Path) -> np.ndarray:
    """A file's bytes as a uint8 array.

    Raises:
        CheckpointError: the file is missing or unreadable.
    """
    try:
        return np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise CheckpointError(f"{path}: {exc.strerror or 'unreadable'}") from None
