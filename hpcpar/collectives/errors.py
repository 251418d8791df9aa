"""Errors of the collectives layer."""

from __future__ import annotations

from typing import Any

from ..errors import HpcparError

__all__ = ["CollectiveError", "CollectiveMismatchError", "explain_mpi_error"]


class CollectiveError(HpcparError):
    """A collective called wrongly: unknown algorithm, bad buffer, bad root or counts."""


class CollectiveMismatchError(CollectiveError):
    """Ranks called a collective with different arguments (found by ``HPCPAR_CHECK=1``)."""


def explain_mpi_error(exc: Any, collective: str) -> Exception:
    """The error to raise for an MPI error inside a collective: one line, with its cause.

    A message longer than the buffer it was received into (MPI's truncation, reported
    directly or through a request's status), or one whose size the library found to
    differ from what this rank expected (MPICH's "message sizes do not match across
    processes"), means the ranks passed different counts or dtypes: that is a
    ``CollectiveMismatchError``. Other MPI errors come back as they are.
    """
    from mpi4py import MPI

    if not isinstance(exc, MPI.Exception):
        return exc
    text = str(exc)
    if exc.Get_error_class() in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS):
        lines = [line for line in text.splitlines() if "truncated" in line and "received" in line]
        detail = f" ({lines[-1].rsplit(': ', 1)[-1].strip()})" if lines else ""
        what = "longer than this rank expected"
    elif _SIZES_DIFFER in text:
        detail = f" ({text.rsplit(_SIZES_DIFFER, 1)[1].strip(' :').splitlines()[0]})"
        what = "of another size than this rank expected"
    else:
        return exc
    return CollectiveMismatchError(
        f"{collective}: a message from another rank was {what}{detail}: the ranks "
        f"passed different counts or dtypes; HPCPAR_CHECK=1 names them"
    )


_SIZES_DIFFER = "message sizes do not match across processes in the collective routine"
