"""``python -m hpcpar.intercept [pyfile | -m mod | -c cmd] [args]``: run under interception.

Like ``python -m mpi4py``: run a program with hpcpar underneath its mpi4py buffer
collectives, an exception on any rank aborting the whole job. Ranks that disagree on a
collective (the mismatch guard's ``CollectiveMismatchError``, raised on every rank at
once) each print one line naming the call and the program's line that made it, and the
job ends with exit status 2.
"""

from __future__ import annotations

import runpy
import sys

from .. import __version__

USAGE = (
    "usage: python -m hpcpar.intercept [--explain-calls] <pyfile> [arg] ...\n"
    "       python -m hpcpar.intercept [--explain-calls] -m <mod> [arg] ...\n"
    "       python -m hpcpar.intercept [--explain-calls] -c <cmd> [arg] ...\n"
    "Runs a program that uses mpi4py with its buffer collectives going through hpcpar.\n"
    "  --explain-calls  at exit, rank 0 prints which calls hpcpar ran and which it left\n"
    "                   to the MPI library, and why (HPCPAR_INTERCEPT_REPORT=-)\n"
    "Environment: HPCPAR_INTERCEPT_SKIP=Allreduce,Bcast leaves those to the library;\n"
    "HPCPAR_INTERCEPT_REPORT=DIR writes every rank's counts to DIR/intercept<R>.json.\n"
)


def _fail(message: str) -> None:
    sys.stderr.write(f"hpcpar intercept: error: {message}\n{USAGE}")
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, install interception, run the program as ``__main__``."""
    args = list(sys.argv[1:] if argv is None else argv)
    explain = False
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c", "-"):
        option = args.pop(0)
        if option in ("-h", "--help"):
            sys.stdout.write(USAGE)
            raise SystemExit(0)
        if option == "--version":
            sys.stdout.write(f"hpcpar {__version__}\n")
            raise SystemExit(0)
        if option == "--explain-calls":
            explain = True
            continue
        _fail(f"unknown option {option}")
    if not args:
        _fail("nothing to run")
    if args[0] in ("-m", "-c") and len(args) < 2:
        _fail(f"argument expected for {args[0]}")
    if explain:
        import os

        os.environ["HPCPAR_INTERCEPT_REPORT"] = "-"
    from ..run import set_up_or_exit
    from ..runtime.abort import install_excepthook
    from . import install

    install_excepthook()
    set_up_or_exit(install)
    from ..collectives.errors import CollectiveMismatchError

    try:
        _run(args)
    except CollectiveMismatchError as exc:
        _mismatch(exc)


def _run(args: list[str]) -> None:
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        code = compile(args[1], "<string>", "exec")
        exec(code, {"__name__": "__main__"})
    else:
        sys.argv = list(args)
        runpy.run_path(args[0], run_name="__main__")


def _mismatch(exc: BaseException) -> None:
    """One line on this rank: the guard's finding and the program's call; exit status 2."""
    import traceback

    from mpi4py import MPI

    from ..runtime.abort import abort_job
    from ..runtime.packages import core_folders

    inside = core_folders()
    frames = traceback.extract_tb(exc.__traceback__)
    site = next((f for f in reversed(frames) if not f.filename.startswith(inside)), None)
    where = f" (called at {site.filename}:{site.lineno})" if site is not None else ""
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    sys.stderr.write(f"[{rank}/{size}] hpcpar: error: {exc}{where}\n")
    if size > 1:
        abort_job(2)  # every rank raised it at the same call: each prints before the abort
    raise SystemExit(2)


if __name__ == "__main__":
    main()
