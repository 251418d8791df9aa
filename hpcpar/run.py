"""Run a Python script as one rank of an MPI job, aborting the job if it raises.

``python -m hpcpar.run script.py args...`` is what ``hpcpar launch -- script.py`` starts
on every rank.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable

__all__ = ["main", "set_up_or_exit"]


def set_up_or_exit(step: Callable[[], object]) -> None:
    """Run ``step``, a set-up every rank makes; a bad setting ends every rank with 2.

    The error is the same on every rank (settings agree), so rank 0 alone prints it.
    """
    from .errors import HpcparError

    try:
        step()
    except HpcparError as exc:
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() == 0:
            sys.stderr.write(f"hpcpar: error: {exc}\n")
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    """Run ``argv[0]`` as ``__main__`` with the abort-on-error hook installed."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        sys.stderr.write("usage: python -m hpcpar.run script.py [args...]\n")
        raise SystemExit(2)
    from .runtime import settings
    from .runtime.abort import install_excepthook

    install_excepthook()
    if settings.is_set("HPCPAR_WATCHDOG"):  # the watchdog watches scripts that use mpi4py only
        from .runtime.comm import default_comm

        set_up_or_exit(default_comm)
    sys.argv = list(args)
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
