"""Which ranks of a job finished normally: markers that ``hpcpar launch`` reads at the end.

``hpcpar launch`` gives the job a folder (``HPCPAR_EXIT_DIR``). A rank that starts
using hpcpar's communicator writes ``rank<R>.started`` there, and at a normal exit of
its interpreter (the end of the program, or ``sys.exit``) ``rank<R>.exited``. A rank
with the first marker and not the second left some other way (``os._exit``, a signal, a
crash of the interpreter), possibly while the other ranks still waited for it in a
collective; MPI launchers may then end the job with status 0 and no word, so the
launcher reports those ranks and fails (``EARLY_EXIT``). Ranks on other hosts write to
their own host's folder, so the check covers the launching host's ranks.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from pathlib import Path

__all__ = ["ENV", "EARLY_EXIT", "mark_started", "unfinished"]

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
    _touch(Path(folder) / f"rank{rank}.started")
    atexit.register(_touch, Path(folder) / f"rank{rank}.exited")


def unfinished(folder: Path) -> list[int]:
    """The ranks that started and did not exit normally, from the markers in ``folder``."""
    started = {int(p.name[4:-8]) for p in folder.glob("rank*.started") if p.name[4:-8].isdigit()}
    exited = {int(p.name[4:-7]) for p in folder.glob("rank*.exited") if p.name[4:-7].isdigit()}
    return sorted(started - exited)
