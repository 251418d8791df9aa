"""Unchanged mpi4py programs with hpcpar's collectives underneath.

``python -m hpcpar.intercept prog.py ARGS`` (under any launcher) or
``hpcpar launch -n N --intercept -- prog.py ARGS`` runs a program that calls mpi4py
directly. Its ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` are then intercepted
communicators (``hpcpar.intercept.comm``): the buffer collectives ``Barrier``,
``Bcast``, ``Reduce``, ``Allreduce``, ``Allgather``, ``Allgatherv``,
``Reduce_scatter_block``, ``Reduce_scatter``, ``Alltoall``, ``Alltoallv``, their
``I...`` and ``..._init`` forms, on these and every communicator made from them, run as
hpcpar's collectives, with the algorithm choice, the mismatch guard, the flight
record, tracing and the watchdog. Anything else passes to the MPI library unchanged,
and so does a collective whose arguments hpcpar does not take as they are (a derived
datatype, a GPU buffer, MPI.BOTTOM, a wrong count): the library then gives its own
result or its own ``MPI.Exception``. ``hpcpar.intercept.record`` counts which calls
went where and why (``HPCPAR_INTERCEPT_REPORT``). See docs/intercept.md.
"""

from __future__ import annotations

import atexit
from typing import Any

from mpi4py import MPI

__all__ = ["install", "installed", "wrap"]

_ORIGINAL: dict[str, Any] = {}


def installed() -> bool:
    """Whether ``MPI.COMM_WORLD`` is intercepted in this process."""
    return bool(_ORIGINAL)


def install() -> None:
    """Make ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` intercepted communicators.

    Collective over ``COMM_WORLD`` (hpcpar's own communicator is made first, from the
    library's ``COMM_WORLD``). Call it before the program reads those names.
    """
    if _ORIGINAL:
        return
    from ..runtime import settings
    from ..runtime.comm import default_comm, world_rank_size
    from . import comm, record

    default_comm()
    skip = settings.value("HPCPAR_INTERCEPT_SKIP") or ""
    comm.configure(_collectives(skip))
    for name in ("COMM_WORLD", "COMM_SELF"):
        _ORIGINAL[name] = getattr(MPI, name)
        setattr(MPI, name, comm.Intracomm(_ORIGINAL[name]))
    where = settings.value("HPCPAR_INTERCEPT_REPORT")
    if where:
        rank, size = world_rank_size()
        atexit.register(record.write_report, where, rank, size)


def _collectives(text: str) -> frozenset[str]:
    """The collective names in ``HPCPAR_INTERCEPT_SKIP`` (``Allreduce,Bcast``)."""
    from ..errors import UsageError
    from .calls import NAMES

    known = {name.lower(): name for name in NAMES}
    names = set()
    for word in text.replace(" ", ",").split(","):
        if not word:
            continue
        name = known.get(word.lower())
        if name is None:
            raise UsageError(
                f"HPCPAR_INTERCEPT_SKIP: unknown collective {word!r}; known: {', '.join(NAMES)}"
            )
        names.add(name)
    return frozenset(names)


def wrap(communicator: Any) -> Any:
    """``communicator`` as an intercepted one (for communicators made by other means)."""
    from .comm import wrap as _wrap

    return _wrap(communicator)
