"""The one results writer: JSON with run metadata, CSV for tables, written by rank 0."""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import HpcparError
from . import settings
from .resume import this_start

__all__ = [
    "run_metadata",
    "write_json",
    "write_csv",
    "atomic_write",
    "ResultsError",
    "git_commit",
    "mpi_library",
]


def git_commit(path: str | os.PathLike[str] | None = None) -> str | None:
    """Return the git commit of the checkout holding ``path`` (hpcpar's own by default)."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=where if where.is_dir() else where.parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def mpi_library() -> str:
    """Return the first line of the MPI library's version string."""
    from mpi4py import MPI

    return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def run_metadata(
    comm: Any = None, *, layout: str | None = None, parameters: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Return the metadata every results file carries.

    Args:
        comm: The job's communicator (its size is recorded); ``None`` means
            ``COMM_WORLD`` if MPI runs, else one rank.
        layout: The virtual node layout in use, if any.
        parameters: The run's parameters (command-line arguments, say).

    Returns:
        A JSON-able dict: hpcpar version, git commit, MPI library, ranks, layout,
        parameters, host, Python version, a UTC timestamp, and the start under
        ``hpcpar launch --restarts`` (``restart``: 0 for the first; ``restart_failed``:
        the ranks whose failure ended the one before; ``resumed_from``: the step and
        levels of the checkpoint restored, if any).
    """
    from mpi4py import MPI

    if comm is None:
        ranks = MPI.COMM_WORLD.Get_size() if MPI.Is_initialized() else 1
    else:
        ranks = comm.Get_size()
    return {
        "hpcpar_version": __version__,
        "git_commit": git_commit(),
        "mpi_library": mpi_library(),
        "mpi4py_version": _mpi4py_version(),
        "ranks": ranks,
        "layout": layout if layout is not None else settings.value("HPCPAR_LAYOUT") or None,
        "parameters": _jsonable(dict(parameters or {})),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **this_start(),
    }


def _mpi4py_version() -> str:
    import mpi4py

    return mpi4py.__version__


def _jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays, paths and tuples into plain JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half a file).

    Raises:
        ResultsError: the file cannot be written (the reason is named).
    """
    try:
        _atomic_write(Path(path), text)
    except OSError as exc:
        raise ResultsError(f"cannot write {path}: {exc.strerror or exc}") from None


class ResultsError(HpcparError):
    """A results file that cannot be written."""


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are for everyone to read
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _is_rank0(comm: Any) -> bool:
    if comm is not None:
        return comm.Get_rank() == 0
    from .comm import world_rank_size

    return world_rank_size()[0] == 0


def write_json(
    path: str | os.PathLike[str],
    results: Any,
    *,
    comm: Any = None,
    layout: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``{"metadata": ..., "results": ...}`` to ``path`` on rank 0, atomically.

    Other ranks write nothing. Returns the path on every rank.
    """
    target = Path(path)
    if _is_rank0(comm):
        doc = {
            "metadata": run_metadata(comm, layout=layout, parameters=parameters),
            "results": _jsonable(results),
        }
        atomic_write(target, json.dumps(doc, indent=2) + "\n")
    return target


def write_csv(
    path: str | os.PathLike[str],
    rows: Iterable[Mapping[str, Any]],
    *,
    columns: Sequence[str] | None = None,
    comm: Any = None,
) -> Path:
    """Write a table (an iterable of dicts) as CSV on rank 0, atomically.

    Args:
        path: The CSV file.
        rows: One dict per row.
        columns: Column order; by default the keys in order of first appearance.
        comm: The job's communicator; only its rank 0 writes.

    Returns:
        The path, on every rank.
    """
    target = Path(path)
    if not _is_rank0(comm):
        return target
    rows = [dict(r) for r in rows]
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _jsonable(v) for k, v in row.items()})
    atomic_write(target, buf.getvalue())
    return target
