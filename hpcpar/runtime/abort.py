"""Abort the whole MPI job when any rank dies of an uncaught exception.

Without this, one rank's exception followed by interpreter exit leaves the other ranks
blocked in their next collective until the allocation runs out (the reason mpi4py's
``python -m mpi4py`` does the same). The traceback is printed once, by the rank that
failed, with a ``[rank/size]`` prefix on every line.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from types import TracebackType

from . import settings

__all__ = ["install_excepthook", "abort_job", "format_exception_for_rank"]

_installed = False
OUTPUT_GRACE = 0.3  # seconds between the last write and MPI_Abort
_RUNNER_FILES = ("runpy.py", "<frozen runpy>", "hpcpar/run.py", "hpcpar\\run.py")


def format_exception_for_rank(
    exc_type: type[BaseException],
    exc: BaseException,
    tb: TracebackType | None,
    rank: int,
    size: int,
) -> str:
    """Return the traceback text with a ``[rank/size]`` prefix on every line."""
    prefix = f"[{rank}/{size}] "
    # Frames of the runner (runpy, hpcpar.run) say nothing about the user's error.
    while tb is not None and tb.tb_frame.f_code.co_filename.endswith(_RUNNER_FILES):
        tb = tb.tb_next
    lines = "".join(traceback.format_exception(exc_type, exc, tb)).splitlines()
    return "".join(f"{prefix}{line}\n" for line in lines)


def abort_job(code: int = 1) -> None:
    """Abort every rank of ``COMM_WORLD`` with ``code`` (flushes stdio first)."""
    from mpi4py import MPI

    from .trace import dump

    dump(final=True)  # this rank's flight record, when HPCPAR_TRACE asks for it
    sys.stdout.flush()
    sys.stderr.flush()
    # The process manager reads a rank's output and its abort request on different
    # channels and stops reading output once the abort arrives: give what was just
    # written the time to be passed on, or the job can end with its error unsaid.
    time.sleep(OUTPUT_GRACE)
    MPI.COMM_WORLD.Abort(code)


def _hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    # A process that never imported mpi4py.MPI is no MPI rank yet; initialising MPI
    # now would block in MPI_Init's process-manager barrier, so exit the plain way.
    mpi = sys.modules.get("mpi4py.MPI")
    running = mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()
    size = mpi.COMM_WORLD.Get_size() if running else 1
    if size == 1:
        _previous_hook(exc_type, exc, tb)
        return
    rank = mpi.COMM_WORLD.Get_rank()
    sys.stderr.write(format_exception_for_rank(exc_type, exc, tb, rank, size))
    sys.stderr.write(
        f"[{rank}/{size}] hpcpar: uncaught exception on rank {rank}; aborting the job\n"
    )
    abort_job(1)


def _thread_hook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    _hook(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)


_previous_hook = sys.excepthook


def install_excepthook() -> None:
    """Make an uncaught exception on any rank (main or other thread) abort the job.

    Idempotent. Set ``HPCPAR_ABORT_ON_ERROR=0`` to keep Python's own behaviour.
    """
    global _installed, _previous_hook
    if _installed or not settings.flag("HPCPAR_ABORT_ON_ERROR"):
        return
    _previous_hook = sys.excepthook
    sys.excepthook = _hook
    threading.excepthook = _thread_hook
    _installed = True
