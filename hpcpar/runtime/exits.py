"""Which ranks of a job finished normally: markers that ``hpcpar launch`` reads at the end.

``hpcpar launch`` gives the job a folder (``HPCPAR_EXIT_DIR``). A rank that starts
using hpcpar's communicator writes ``rank<R>.started`` there, and at a normal exit of
its interpreter (the end of the program, or ``sys.exit``) ``rank<R>.exited``. A rank
with the first marker and not the second left some other way (``os._exit``, a signal, a
crash of the interpreter), possibly while the other ranks still waited for it in a
collective; MPI launchers may then end the job with status 0 and no word, so the
launcher reports those ranks and fails (``EARLY_EXIT``). Ranks on other hosts write to
their own host's folder, so the check covers the launching host's ranks.

A rank that ends the job on purpose with ``os._exit`` (the watchdog) first writes
``rank<R>.ended`` holding its status: the launcher then reports that status, whatever
the MPI launcher made of the ranks it killed after the first one left.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from pathlib import Path

__all__ = ["ENV", "EARLY_EXIT", "ended", "mark_ended", "mark_started", "unfinished"]

ENV = "HPCPAR_EXIT_DIR"
EARLY_EXIT = 3  # hpcpar launch's status when the job said 0 but ranks left unfinished


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # the folder is on another host, or gone
        path.write_text(f"{os.getpid()}\n")


def mark_started(rank: int) -> None:
    """Record that ``rank`` runs, and that it exits normally when it does (if launched)."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    global _rank
    _rank = rank
    _touch(Path(folder) / f"rank{rank}.started")
    atexit.register(_touch, Path(folder) / f"rank{rank}.exited")


_rank: int | None = None


def mark_ended(status: int) -> None:
    """Record that this rank ends the job on purpose with ``status`` (before ``os._exit``)."""
    folder = os.environ.get(ENV)
    if folder and _rank is not None:
        with contextlib.suppress(OSError):
            (Path(folder) / f"rank{_rank}.ended").write_text(f"{status}\n")


def ended(folder: Path) -> dict[int, int]:
    """The ranks that ended the job on purpose, with the status each gave."""
    out = {}
    for p in folder.glob("rank*.ended"):
        with contextlib.suppress(OSError, ValueError):
            out[int(p.name[4:-6])] = int(p.read_text().strip())
    return out


def unfinished(folder: Path) -> list[int]:
    """The ranks that started and did not exit normally, from the markers in ``folder``.

    Ranks that ended the job on purpose (``ended``) are not among them.
    """
    started = {int(p.name[4:-8]) for p in folder.glob("rank*.started") if p.name[4:-8].isdigit()}
    exited = {int(p.name[4:-7]) for p in folder.glob("rank*.exited") if p.name[4:-7].isdigit()}
    return sorted(started - exited - set(ended(folder)))
