"""The ``hpcpar`` entry point: parse, run the subcommand, turn user errors into exit 2.

Every rank parses the same command line, so a usage error happens on all of them:
rank 0 prints it and every rank exits 2 without touching MPI. An ``HpcparError``
raised while a command runs is agreed on first: if every rank raised, rank 0 prints
one line and all exit 2; if some ranks did not (they may be blocked in a collective),
the failing rank prints its line and aborts the job with status 2 so nothing hangs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, NoReturn

from .._version import __version__
from ..errors import HpcparError, UsageError
from ..plugins import Command, commands
from ..runtime.env import launcher_rank_size

__all__ = ["main", "build_parser", "ERROR_AGREEMENT_SECONDS"]

# How long a rank that hit a user error waits for the others to hit it too before it
# concludes they are elsewhere and aborts the job.
ERROR_AGREEMENT_SECONDS = 5.0


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of exiting, and prints help on rank 0 only."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("hpcpar").strip()
        hint = f"see 'hpcpar {where + ' ' if where else ''}--help'"
        raise UsageError(f"{where + ': ' if where else ''}{message} ({hint})")

    def _print_message(self, message: str, file: Any = None) -> None:
        if launcher_rank_size()[0] == 0:
            super()._print_message(message, file)


def build_parser() -> argparse.ArgumentParser:
    """Build the parser with one subparser per registered subcommand."""
    parser = _Parser(
        prog="hpcpar",
        description="hpcpar: topology-aware collectives, datatypes and checkpointing for MPI jobs.",
        epilog="Run 'hpcpar COMMAND --help' for a command's options. "
        "Inside an MPI job every rank runs the same command.",
    )
    parser.add_argument("--version", action="version", version=f"hpcpar {__version__}")
    sub = parser.add_subparsers(dest="hpcpar_command", metavar="COMMAND", parser_class=_Parser)
    for command in commands().values():
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(child)
    return parser


def _say(message: str) -> None:
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stderr.flush()


def _fail_together(exc: HpcparError, guard: Any) -> int:
    from ..runtime.abort import abort_job

    rank, size = guard.Get_rank(), guard.Get_size()
    request = guard.Ibarrier()
    deadline = time.monotonic() + ERROR_AGREEMENT_SECONDS
    while not request.Test():
        if time.monotonic() > deadline:
            _say(f"[{rank}/{size}] hpcpar: error: {exc}")
            abort_job(2)
        time.sleep(0.005)
    if rank == 0:
        _say(f"hpcpar: error: {exc}")
    return 2


def _run_with_mpi(command: Command, args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from ..runtime.comm import default_comm

    try:
        comm = default_comm()  # (the same on every rank: its errors are too)
    except HpcparError as exc:
        if MPI.COMM_WORLD.Get_rank() == 0:
            _say(f"hpcpar: error: {exc}")
        return 2
    guard = MPI.COMM_WORLD.Dup()  # only error agreement runs here, so it cannot mismatch
    try:
        status = command.run(comm, args)
    except HpcparError as exc:
        return _fail_together(exc, guard)
    guard.Free()
    return int(status or 0)


CLOSED_PIPE_EXIT = 128 + 13  # as a Unix tool killed by SIGPIPE: the reader went away


def main(argv: list[str] | None = None) -> int:
    """Run the ``hpcpar`` command line and return the exit status.

    Output to a pipe whose reader has gone (``hpcpar checkpoint ls DIR | head -2``)
    ends the command quietly with ``CLOSED_PIPE_EXIT``, as the Unix tools end.
    """
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe prints a traceback
        return status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_PIPE_EXIT


def _main(argv: list[str] | None) -> int:
    rank, _ = launcher_rank_size()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.hpcpar_command is None:
            raise UsageError("no command given (see 'hpcpar --help')")
        command = commands()[args.hpcpar_command]
        if not command.needs_mpi:
            return int(command.run(None, args) or 0)
    except HpcparError as exc:
        if rank == 0:
            _say(f"hpcpar: error: {exc}")
        return 2
    return _run_with_mpi(command, args)
