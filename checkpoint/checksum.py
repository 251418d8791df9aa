"""Checksums of checkpoint data: CRC-32C where the ``crc32c`` package is installed.

CRC-32C runs on the CPU's CRC instruction (several times zlib's CRC-32) and releases
the GIL, so hashing a large shard next to the thread that writes it costs little
(``hpcpar bench checkpoint`` measures the flush it is part of). Files record which one they used
(``crc32c`` or ``crc32``); both are read, whichever wrote them.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from .state import CheckpointError

__all__ = [
    "KEY",
    "BLOCK",
    "digest",
    "digest_array",
    "matches",
    "block_digests",
    "block_size",
    "block_matches",
]

# Arrays longer than this carry one checksum per block of it, so that a reader of part
# of an array (a resharding restore) verifies only the blocks it reads.
BLOCK = 1 << 20

try:
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - crc32c is a dependency; zlib is the fallback
    _crc32c = None

KEY = "crc32c" if _crc32c is not None else "crc32"


def _hex(value: int) -> str:
    return f"{value:08x}"


def digest(data: Any) -> str:
    """The checksum of a buffer (bytes-like, C-contiguous), as 8 hex digits, under ``KEY``."""
    view = memoryview(data).cast("B")
    return _hex(_crc32c(view) if _crc32c is not None else zlib.crc32(view))


def digest_array(data: Any) -> dict[str, Any]:
    """The checksum record of an array's bytes: one digest, or one per ``BLOCK`` bytes.

    Returns:
        ``{KEY: hex}`` for up to ``BLOCK`` bytes, else ``{KEY + "_blocks": [hex, ...],
        "block_bytes": BLOCK}``.
    """
    view = memoryview(data).cast("B")
    if len(view) <= BLOCK:
        return {KEY: digest(view)}
    return {
        KEY + "_blocks": [digest(view[s : s + BLOCK]) for s in range(0, len(view), BLOCK)],
        "block_bytes": BLOCK,
    }


def block_digests(record: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """``(algorithm, digests)`` of a record with per-block checksums, else None."""
    for name in ("crc32c", "crc32"):
        blocks = record.get(name + "_blocks")
        if isinstance(blocks, list):
            return name, blocks
    return None


def block_size(record: Mapping[str, Any]) -> int:
    """The block length of a per-block record (0 if it has none or a bad one)."""
    size = record.get("block_bytes")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


def block_matches(algorithm: str, expected: str, data: Any, where: str) -> bool:
    """Whether one block's bytes have the digest ``expected`` (``crc32c`` or ``crc32``)."""
    return matches({algorithm: expected}, data, where)


def matches(record: Mapping[str, Any], data: Any, where: str) -> bool:
    """Whether ``data`` has the checksum ``record`` holds (whole or per block).

    The record names its algorithm: ``crc32c`` or ``crc32``.

    Raises:
        CheckpointError: the record uses CRC-32C and the ``crc32c`` package is missing.
    """
    view = memoryview(data).cast("B")
    blocks = block_digests(record)
    if blocks is not None:
        size = block_size(record)
        if not size or len(blocks[1]) != -(-len(view) // size):
            return False
        return all(
            matches({blocks[0]: d}, view[k * size : (k + 1) * size], where)
            for k, d in enumerate(blocks[1])
        )
    if "crc32c" in record:
        if _crc32c is None:
            raise CheckpointError(f"{where}: written with CRC-32C; install the crc32c package")
        return _hex(_crc32c(view)) == record["crc32c"]
    return "crc32" in record and _hex(zlib.crc32(view)) == record["crc32"]
