"""Helpers for checkpoint tests: comparing nested states, a directory shared by ranks."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def same(a, b) -> bool:
    """Nested dicts equal, arrays equal bit for bit with the same dtype."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def shared_dir(comm, tmp_path) -> Path:
    """Rank 0's temporary directory, on every rank."""
    return Path(comm.bcast(str(tmp_path), root=0))
