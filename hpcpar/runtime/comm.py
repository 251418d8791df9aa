"""The library's own communicator, and turning a ``comm=`` argument into one."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from ..errors import CommunicatorError
from . import settings
from .abort import install_excepthook
from .exits import mark_started
from .trace import arm as arm_trace
from .watchdog import start_from_env as start_watchdog

__all__ = ["default_comm", "end_of_job", "idle_barrier", "resolve_comm", "world_rank_size"]

_lock = threading.Lock()
_default: MPI.Intracomm | None = None
_ending: list[Callable[[MPI.Intracomm], None]] = []  # end_of_job's functions


def end_of_job(function: Callable[[MPI.Intracomm], None]) -> None:
    """Call ``function(comm)`` on every rank as the program ends normally.

    ``comm`` is a world-wide communicator kept for these calls alone, so their
    collective calls never match another call of a rank that is still running. They
    run after the watchdog has been told that this rank finished and before MPI is
    finalised, in the order they were added, on a process that made the default
    communicator. Add them at import time, so that every rank has the same.
    """
    _ending.append(function)


def default_comm() -> MPI.Intracomm:
    """Return hpcpar's cached duplicate of ``COMM_WORLD``, creating it on first use.

    Library traffic runs on this duplicate so that it never matches the user's own
    messages. Creating it is collective over ``COMM_WORLD``: every rank must make its
    first hpcpar call that needs it.
    """
    global _default
    made = _default
    if made is not None:  # made once; the lock only guards making it (every call saved)
        return made
    with _lock:
        if _default is None:
            _ensure_initialized()
            settings.check()  # a typo in any HPCPAR_* value fails here, naming it
            install_excepthook()
            comm = MPI.COMM_WORLD.Dup()
            comm.Set_name("hpcpar")
            mark_started(MPI.COMM_WORLD.Get_rank())
            ending = MPI.COMM_WORLD.Dup()
            ending.Set_name("hpcpar-end")
            atexit.register(_end, ending)  # after the watchdog's goodbye (registered later)
            arm_trace(MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
            start_watchdog(comm)  # when HPCPAR_WATCHDOG asks for one
            _default = comm
        return _default


def _ensure_initialized() -> None:
    """Initialise MPI where mpi4py was loaded without it, and finalise it at exit.

    ``runtime.mpiinfo`` loads the library that way to describe it for the launcher.
    """
    if MPI.Is_initialized():
        return
    MPI.Init_thread(MPI.THREAD_MULTIPLE)
    atexit.register(_finalize)


def _end(comm: MPI.Intracomm) -> None:
    if MPI.Is_initialized() and not MPI.Is_finalized():
        for function in _ending:
            function(comm)


def _finalize() -> None:
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


def resolve_comm(comm: Any = None) -> MPI.Intracomm:
    """Turn a ``comm=`` argument into an intra-communicator.

    Args:
        comm: ``None`` (hpcpar's default communicator), an ``MPI.Intracomm``, or an
            object with a ``comm`` attribute holding one (such as a ``Hierarchy``).

    Returns:
        The communicator to run on.

    Raises:
        CommunicatorError: ``comm`` is an inter-communicator, null, or not a communicator.
    """
    if comm is None:
        return default_comm()
    if type(comm) is MPI.Intracomm:  # the common case, before the slower checks
        return comm
    inner = getattr(comm, "comm", None)
    if isinstance(inner, MPI.Intracomm):
        comm = inner
    if isinstance(comm, MPI.Intercomm):
        raise CommunicatorError(
            "comm= is an inter-communicator; hpcpar needs an intra-communicator"
        )
    if not isinstance(comm, MPI.Intracomm):
        raise CommunicatorError(
            f"comm= must be an MPI.Intracomm or None, not {type(comm).__name__}"
        )
    if comm == MPI.COMM_NULL:
        raise CommunicatorError("comm= is MPI.COMM_NULL")
    install_excepthook()
    return comm


def world_rank_size() -> tuple[int, int]:
    """Return (rank, size) in ``COMM_WORLD`` if MPI is running, else from the launcher.

    Never initialises MPI: before ``MPI_Init`` (or when mpi4py was told not to
    initialise) it reads the rank from the process manager's environment variables.
    """
    from .env import launcher_rank_size

    if MPI.Is_initialized() and not MPI.Is_finalized():
        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return launcher_rank_size()


def idle_barrier(comm: Any, poll_s: float = 0.002) -> None:
    """A barrier that sleeps while it waits.

    For ranks that sit out while one rank measures something alone: a spinning
    ``Barrier`` would take the cores the measured rank needs.
    """
    import time

    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(poll_s)
