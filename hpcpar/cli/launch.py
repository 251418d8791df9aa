"""``hpcpar launch``: start an MPI job with the right mpiexec (or srun) and safe defaults."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from ..errors import UsageError
from ..plugins import Command, commands, register
from ..runtime import settings
from .common import add_layout_argument, integer, real

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "hpcpar launch -n N [--layout L] [--timeout S] [--restarts K] [--intercept] "
        "[--dry-run] -- COMMAND [ARGS...]"
    )
    parser.epilog = (
        "COMMAND is an hpcpar subcommand (demo, info, bench ...), a script.py, or any program. "
        "Environment: HPCPAR_MPIEXEC picks the mpiexec, HPCPAR_LAUNCHER the launcher, "
        "HPCPAR_TIMEOUT the default --timeout, HPCPAR_RESTARTS the default --restarts."
    )
    parser.add_argument(
        "-n",
        "--np",
        dest="ranks",
        type=integer(1, 1 << 20),
        required=True,
        metavar="N",
        help="number of ranks",
    )
    add_layout_argument(parser)
    parser.add_argument(
        "--timeout",
        type=real(0, above=True),
        default=None,
        metavar="S",
        help="kill the whole job after S seconds (all its starts, with --restarts), exit 124 "
        "(default: $HPCPAR_TIMEOUT, else none)",
    )
    add_restart_arguments(parser)
    parser.add_argument(
        "--watchdog",
        type=real(0, 1e9, above=True),
        default=None,
        metavar="S",
        help="report a rank waiting in one call for more than S seconds, with every rank's "
        "state, and end the job with status 4 (sets HPCPAR_WATCHDOG; "
        "HPCPAR_WATCHDOG_ACTION=report only reports)",
    )
    parser.add_argument(
        "--intercept",
        action="store_true",
        help="run a Python program that calls mpi4py with its buffer collectives going "
        "through hpcpar (python -m hpcpar.intercept; docs/intercept.md)",
    )
    parser.add_argument(
        "--explain-calls",
        action="store_true",
        help="with --intercept: at exit, rank 0 prints which calls went to hpcpar and "
        "which to the MPI library, and why (sets HPCPAR_INTERCEPT_REPORT=-)",
    )
    parser.add_argument(
        "--launcher",
        choices=("auto", "mpiexec", "srun"),
        default=settings.value("HPCPAR_LAUNCHER"),
        help="auto: srun inside a Slurm allocation, else mpiexec (default: auto)",
    )
    parser.add_argument(
        "--oversubscribe",
        action="store_true",
        help="allow more than 8 ranks per core of this host (mpiexec; refused otherwise)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the command and environment, run nothing"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="what every rank runs, after --")


def add_restart_arguments(parser: argparse.ArgumentParser) -> None:
    """``--restarts``, ``--restart-backoff`` and ``--restart-report`` (launch, vcluster run)."""
    parser.add_argument(
        "--restarts",
        type=integer(0, 1000),
        default=None,
        metavar="K",
        help="start the job again when it fails (a rank killed or crashed, an error, the "
        "watchdog ending a hang), at most K times; every start sees HPCPAR_RESTART; programs "
        "that checkpoint resume from their newest checkpoint (default: $HPCPAR_RESTARTS, "
        "else 0; docs/recovery.md)",
    )
    parser.add_argument(
        "--restart-backoff",
        type=real(0, 3600),
        default=1.0,
        metavar="S",
        help="a restart is at once, but after a start that failed within 10 s of the one "
        "before (a crash loop) the next waits S seconds, twice that after the next such "
        "failure, and so on up to 30 s (default 1)",
    )
    parser.add_argument(
        "--min-ranks",
        type=integer(1, 1 << 20),
        default=1,
        metavar="M",
        help="with --restarts: a job that lost (virtual) nodes restarts on the ranks of the "
        "other nodes if at least M are left (default 1)",
    )
    parser.add_argument(
        "--spares",
        type=integer(0, 1 << 20),
        default=0,
        metavar="S",
        help="with --restarts: S nodes kept idle to replace lost ones, so the job restarts "
        "on as many ranks as before (default 0)",
    )
    parser.add_argument(
        "--restart-report",
        default=None,
        metavar="FILE",
        help="write each restart's cause and phases (teardown, back-off, new start) as JSON",
    )


def run_planned(
    plan: Any,
    args: argparse.Namespace,
    timeout: float | None,
    replan: Any = None,
    layout: str | None = None,
) -> int:
    """Run ``plan`` once, or with ``args.restarts`` restarts (``run_restarting``)."""
    from ..launcher import run_job
    from ..restarts import run_restarting

    restarts = args.restarts if args.restarts is not None else settings.value("HPCPAR_RESTARTS")
    if not restarts and args.restart_report is None:
        return run_job(plan, timeout=timeout)
    return run_restarting(
        plan,
        restarts or 0,
        timeout=timeout,
        backoff=args.restart_backoff,
        report=args.restart_report,
        replan=replan,
        layout=layout,
        min_ranks=args.min_ranks,
        spares=args.spares,
    )


def _timeout(args: argparse.Namespace) -> float | None:
    if args.timeout is not None:
        value = args.timeout
    else:
        value = settings.value("HPCPAR_TIMEOUT")
        if value is None:
            return None
    if value <= 0:
        raise UsageError(f"launch: --timeout must be positive, not {value:g}")
    return value


def check_watchdog_settings(env: dict[str, str]) -> None:
    """Refuse a bad ``HPCPAR_WATCHDOG``/``HPCPAR_WATCHDOG_ACTION`` before the job starts."""
    from ..runtime.watchdog import settings

    settings(env)


def _run(_comm: Any, args: argparse.Namespace) -> int:
    from ..launcher import plan_launch

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    timeout = _timeout(args)

    def planned(ranks: int, layout: str | None) -> Any:
        plan = plan_launch(
            ranks,
            command,
            layout=layout,
            launcher=args.launcher,
            known_commands=commands().keys(),
            oversubscribe=args.oversubscribe,
            intercept=args.intercept,
        )
        if args.explain_calls:
            plan.env["HPCPAR_INTERCEPT_REPORT"] = "-"
        if args.watchdog is not None:
            plan.env["HPCPAR_WATCHDOG"] = f"{args.watchdog:g}"
        return plan

    if args.explain_calls and not args.intercept:
        raise UsageError("launch: --explain-calls needs --intercept")
    layout = args.layout or settings.value("HPCPAR_LAYOUT")
    plan = planned(args.ranks, args.layout)
    check_watchdog_settings({**os.environ, **plan.env})
    if args.dry_run:
        for note in plan.notes:
            print(f"# {note}")
        for key, value in sorted(plan.env.items()):
            print(f"export {key}={shlex.quote(value)}")
        print(shlex.join(plan.argv))
        sys.stdout.flush()
        return 0
    return run_planned(plan, args, timeout, planned, layout)


register(
    Command(
        "launch",
        "start an MPI job: hpcpar launch -n N [--layout L] [--timeout S] [--watchdog S] "
        "[--restarts K] -- COMMAND",
        _add_arguments,
        _run,
        needs_mpi=False,
    )
)
