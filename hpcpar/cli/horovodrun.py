"""``hpcpar horovodrun``: Horovod's launcher command line, mapped to ``hpcpar launch``.

``hpcpar horovodrun -np 4 python train.py`` is ``hpcpar launch -n 4 -- python
train.py``; Horovod's tuning flags become the ``HOROVOD_*`` variables that
``hpcpar.horovod`` honours (docs/horovod.md). Hosts (``-H host:slots,...`` or
``--hostfile``) on this machine only check that the slots hold the processes; other
hosts go to mpiexec as its host list. Inside a Slurm allocation the allocation's
nodes are used (``-H`` is refused there).
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
from typing import Any

from ..errors import UsageError
from ..plugins import Command, commands, register
from .common import add_layout_argument, integer, real

__all__ = ["parse_hosts"]

_LOCAL = {"localhost", "127.0.0.1", "::1"}


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "hpcpar horovodrun -np N [-H HOSTS | --hostfile FILE] [options] COMMAND [ARGS...]"
    )
    parser.epilog = (
        "Horovod's Gloo launcher, elastic mode (--min-np, --max-np, "
        "--host-discovery-script) and ssh options are refused: the job runs over MPI "
        "(hpcpar launch: mpiexec, or srun inside a Slurm allocation)."
    )
    parser.add_argument(
        "-np",
        "--num-proc",
        dest="np",
        type=integer(1, 1 << 20),
        required=True,
        metavar="N",
        help="number of processes",
    )
    parser.add_argument(
        "-H",
        "--hosts",
        default=None,
        metavar="HOSTS",
        help="host:slots,... (default: this host)",
    )
    parser.add_argument(
        "--hostfile",
        default=None,
        metavar="FILE",
        help="a file of lines 'host slots=N' (or host:N)",
    )
    parser.add_argument("--mpi", action="store_true", help="run over MPI (the only way here)")
    parser.add_argument("--gloo", action="store_true", help="refused: the job runs over MPI")
    parser.add_argument(
        "--fusion-threshold-mb",
        type=real(0),
        default=None,
        metavar="MB",
        help="gradient bucket size in MiB (HOROVOD_FUSION_THRESHOLD)",
    )
    parser.add_argument(
        "--cycle-time-ms",
        type=real(0),
        default=None,
        metavar="MS",
        help="HOROVOD_CYCLE_TIME (no effect here: named in a warning)",
    )
    parser.add_argument(
        "--cache-capacity",
        type=integer(0, 1 << 30),
        default=None,
        metavar="N",
        help="HOROVOD_CACHE_CAPACITY (no effect here: named in a warning)",
    )
    parser.add_argument(
        "--hierarchical-allreduce",
        action="store_true",
        help="hpcpar's two_level allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE=1)",
    )
    parser.add_argument(
        "--autotune",
        action="store_true",
        help="bucket size from the cost model (HOROVOD_AUTOTUNE=1; also the default)",
    )
    parser.add_argument(
        "--timeline-filename",
        default=None,
        metavar="FILE",
        help="Chrome-trace timeline written by rank 0 (HOROVOD_TIMELINE)",
    )
    parser.add_argument("--log-level", default=None, metavar="LEVEL", help="HOROVOD_LOG_LEVEL")
    parser.add_argument(
        "--start-timeout",
        type=real(0, above=True),
        default=None,
        metavar="S",
        help="accepted for Horovod's command line (hpcpar launch starts the ranks at once)",
    )
    parser.add_argument("--verbose", action="store_true", help="print the hpcpar launch plan")
    add_layout_argument(parser)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the command and environment, run nothing"
    )
    for refused in ("--min-np", "--max-np", "--host-discovery-script", "-p", "--ssh-port"):
        parser.add_argument(
            refused, dest=f"refused_{refused.strip('-')}", default=None, help=argparse.SUPPRESS
        )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="what every process runs")


def parse_hosts(text: str, where: str) -> list[tuple[str, int]]:
    """``host:slots,...`` (or hostfile lines) as (host, slots) pairs; UsageError if bad."""
    hosts = []
    for line in text.replace("\n", ",").split(","):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        if " slots=" in item:
            name, _, slots = item.partition(" slots=")
        elif ":" in item:
            name, _, slots = item.rpartition(":")
        else:
            name, slots = item, "1"
        if not name.strip() or not slots.strip().isdigit() or int(slots) < 1:
            raise UsageError(f"horovodrun: {where}: bad host entry {item!r} (host:slots)")
        hosts.append((name.strip(), int(slots)))
    if not hosts:
        raise UsageError(f"horovodrun: {where} names no host")
    return hosts


def _is_local(host: str) -> bool:
    return host in _LOCAL or host in (socket.gethostname(), socket.getfqdn())


def _environment(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    if args.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * (1 << 20)))
    if args.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{args.cycle_time_ms:g}"
    if args.cache_capacity is not None:
        env["HOROVOD_CACHE_CAPACITY"] = str(args.cache_capacity)
    if args.hierarchical_allreduce:
        env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    if args.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if args.timeline_filename:
        env["HOROVOD_TIMELINE"] = os.path.abspath(args.timeline_filename)
    if args.log_level:
        env["HOROVOD_LOG_LEVEL"] = args.log_level
    return env


def _refuse(args: argparse.Namespace) -> list[str]:
    """What cannot run here, as a one-line error; else the command to run."""
    for name, value in vars(args).items():
        if name.startswith("refused_") and value is not None:
            flag = name.removeprefix("refused_").replace("_", "-")
            raise UsageError(
                f"horovodrun: --{flag} is not supported: hpcpar runs a fixed set of MPI "
                "ranks (elastic jobs: hvd.elastic with hpcpar launch; docs/horovod.md)"
            )
    if args.gloo:
        raise UsageError("horovodrun: --gloo is not supported: hpcpar.horovod runs over MPI")
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("horovodrun: no command to run (e.g. python train.py)")
    return command


def _hosts(args: argparse.Namespace) -> list[tuple[str, int]] | None:
    """The hosts of ``-H`` or ``--hostfile`` (None: neither)."""
    if args.hosts and args.hostfile:
        raise UsageError("horovodrun: give -H or --hostfile, not both")
    hosts = None
    if args.hosts:
        hosts = parse_hosts(args.hosts, "-H")
    elif args.hostfile:
        try:
            with open(args.hostfile) as f:
                hosts = parse_hosts(f.read(), args.hostfile)
        except OSError as exc:
            raise UsageError(f"horovodrun: cannot read --hostfile: {exc.strerror}") from None
    return hosts


def _run(_comm: Any, args: argparse.Namespace) -> int:
    from ..launcher import plan_launch, run_job

    command = _refuse(args)
    hosts = _hosts(args)
    plan = plan_launch(args.np, command, layout=args.layout, known_commands=commands().keys())
    if hosts is not None:
        slots = sum(n for _, n in hosts)
        if slots < args.np:
            raise UsageError(
                f"horovodrun: -np {args.np} needs {args.np} slots; the hosts give {slots}"
            )
        remote = [h for h, _ in hosts if not _is_local(h)]
        if remote:
            if plan.launcher == "srun":
                raise UsageError(
                    "horovodrun: inside a Slurm allocation the processes run on its "
                    "nodes; drop -H/--hostfile"
                )
            from ..launcher import find_mpi

            listed = ",".join(f"{h}:{n}" for h, n in hosts)
            option = "--host" if find_mpi().vendor == "openmpi" else "-hosts"
            plan.argv[1:1] = [option, listed]
            plan.notes.append(f"hosts from horovodrun: {listed}")
    plan.env.update(_environment(args))
    if args.dry_run or args.verbose:
        for note in plan.notes:
            print(f"# {note}")
        for key, value in sorted(plan.env.items()):
            print(f"export {key}={shlex.quote(value)}")
        print(shlex.join(plan.argv))
        sys.stdout.flush()
        if args.dry_run:
            return 0
    return run_job(plan, timeout=None)


register(
    Command(
        "horovodrun",
        "run a Horovod script: hpcpar horovodrun -np N [-H host:slots,...] python train.py",
        _add_arguments,
        _run,
        needs_mpi=False,
    )
)
