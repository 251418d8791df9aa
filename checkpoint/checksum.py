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

__all__ = ["KEY", "digest", "matches"]

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


def matches(record: Mapping[str, Any], data: Any, where: str) -> bool:
    """Whether ``data`` has the checksum ``record`` holds (under ``crc32c`` or ``crc32``).

    Raises:
        CheckpointError: the record uses CRC-32C and the ``crc32c`` package is missing.
    """
    view = memoryview(data).cast("B")
    if "crc32c" in record:
        if _crc32c is None:
            raise CheckpointError(f"{where}: written with CRC-32C; install the crc32c package")
        return _hex(_crc32c(view)) == record["crc32c"]
    return "crc32" in record and _hex(zlib.crc32(view)) == record["crc32"]
