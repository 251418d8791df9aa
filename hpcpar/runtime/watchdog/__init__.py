"""The watchdog: a job whose ranks wait in a call for too long is reported, then ended.

``HPCPAR_WATCHDOG=SECONDS`` (``hpcpar launch --watchdog S``) starts, on every rank, a
monitor thread that never touches MPI. The ranks talk over TCP: rank 0 listens (its
address reaches the others in one broadcast when hpcpar first uses MPI), every rank
connects to it, and each monitor sends, every fraction of the limit, what its rank is
doing: the call it started last (the flight record's ``HOT.current``), whether the rank's
thread is blocked in it, and for how long. A thread is blocked in a call when the
innermost frame of its stack is hpcpar's (a collective, a point-to-point call, a halo
exchange, a checkpoint phase) or, for programs calling mpi4py themselves, a source
line calling an MPI method (``comm.Allreduce(...)``): a rank computing, sleeping or
reading a file is not waiting.

When a rank has been blocked in one call longer than the limit, rank 0 asks every
rank for its stack and last calls and prints one report: the call and its sequence
number, the ranks inside it, each other rank's last call and where its thread is now,
the ranks that left the job (normally, or without finishing), and ranks whose records
differ at one sequence number (a mismatch). Then every rank exits with status
``EXIT_STATUS``, or with ``HPCPAR_WATCHDOG_ACTION=report`` the job goes on (a hang that
changes is reported again). A rank that loses rank 0 reports its own state when it
waits past the limit. While the job is traced (``HPCPAR_TRACE``, every call its own
entry), rank 0 also names, once, a rank that arrives late at the collectives again and
again (``trace.slow_ranks`` over the last ``SLOW_WINDOW`` collectives).
"""

from __future__ import annotations

import atexit
import socket
import threading
from typing import Any

from ..settings import value
from .coordinator import Coordinator
from .monitor import Monitor
from .report import ACTION_ENV, ENV, EXIT_STATUS
from .stacks import blocked_in
from .wire import connect, own_addresses

__all__ = [
    "ENV",
    "ACTION_ENV",
    "EXIT_STATUS",
    "settings",
    "start_from_env",
    "running",
    "blocked_in",
]

_state: dict[str, Any] = {}


def running() -> bool:
    """Whether this rank's watchdog has been started."""
    return bool(_state)


def settings(env: Any = None) -> tuple[float, str] | None:
    """The limit and action ``env`` (default: this process's environment) asks for.

    None when ``HPCPAR_WATCHDOG`` is unset or empty.

    Raises:
        UsageError: a limit that is not a positive number of seconds, or an unknown action.
    """
    limit = value(ENV, env)
    return None if limit is None else (limit, value(ACTION_ENV, env))


def start_from_env(comm: Any) -> None:
    """Start this rank's watchdog if ``HPCPAR_WATCHDOG`` asks for one (collective, once).

    ``comm``: a communicator spanning the job (a duplicate of ``COMM_WORLD``); it is
    used once here to pass rank 0's address, never by the watchdog afterwards.

    Raises:
        UsageError: a limit that is not a positive number, or an unknown action.
    """
    if _state:
        return
    chosen = settings()
    if chosen is None:
        return
    limit, action = chosen
    rank, size = comm.Get_rank(), comm.Get_size()
    coordinator = None
    where = None
    if rank == 0:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", 0))
        server.listen(max(size, 8))
        coordinator = Coordinator(server, size, limit, action)
        coordinator.start()
        where = (server.getsockname()[1], own_addresses())
    port, addresses = comm.bcast(where, root=0)
    link = connect(addresses, port, rank)
    monitor = Monitor(link, rank, limit, action, threading.main_thread().ident)
    monitor.coordinator = coordinator
    _state.update(limit=limit, action=action, monitor=monitor, coordinator=coordinator)
    monitor.start()
    atexit.register(monitor.goodbye)
