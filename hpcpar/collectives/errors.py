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
    directly or through a request's status) means the ranks passed different counts or
    dtypes: that is a ``CollectiveMismatchError``. Other MPI errors come back as they are.
    """
    from mpi4py import MPI

    kind = exc.Get_error_class() if isinstance(exc, MPI.Exception) else None
    if kind not in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS):
        return exc
    lines = [line for line in str(exc).splitlines() if "truncated" in line and "received" in line]
    detail = f" ({lines[-1].rsplit(': ', 1)[-1].strip()})" if lines else ""
    return CollectiveMismatchError(
        f"{collective}: a message from another rank was longer than this rank expected"
        f"{detail}: the ranks passed different counts or dtypes; HPCPAR_CHECK=1 names them"
    )
