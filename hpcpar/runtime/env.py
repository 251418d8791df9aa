"""What the process manager tells a rank through its environment, read without MPI."""

from __future__ import annotations

import os

__all__ = ["launcher_rank_size", "getenv_fast", "usable_cores", "RAW_ENVIRON"]

# (rank variable, size variable) of the process managers we know: Hydra/PMI, PMIx,
# Open MPI, Slurm.
_RANK_SIZE_VARS = (
    ("PMI_RANK", "PMI_SIZE"),
    ("PMIX_RANK", "PMIX_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)


def launcher_rank_size() -> tuple[int, int]:
    """Return (rank, size) as the process manager set them, or (0, 1) outside a job."""
    for rank_var, size_var in _RANK_SIZE_VARS:
        rank = os.environ.get(rank_var)
        if rank is not None and rank.isdigit():
            size = os.environ.get(size_var, "")
            return int(rank), int(size) if size.isdigit() else int(rank) + 1
    return 0, 1


_RAW = getattr(os.environ, "_data", None)  # CPython's encoded mapping behind os.environ
# The live environment as a dict of bytes (POSIX CPython), for the hottest paths; else None.
RAW_ENVIRON = _RAW if os.name == "posix" else None


def getenv_fast(name: str, key: bytes | None = None) -> str | None:
    """``os.environ.get(name)`` for hot paths (a plain dict lookup where CPython allows).

    Reads the live environment, so a variable set later (``os.environ[...] = ...``,
    pytest's monkeypatch) is seen at once.
    """
    if _RAW is not None and os.name == "posix":
        value = _RAW.get(key if key is not None else os.fsencode(name))
        return None if value is None else os.fsdecode(value)
    return os.environ.get(name)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
