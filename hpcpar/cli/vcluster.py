"""``hpcpar vcluster up|run|status|down``: a shaped multi-node cluster on one machine."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from ..plugins import Command, commands, register
from .common import integer, real
from .launch import add_restart_arguments, run_planned

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    up = sub.add_parser("up", help="create N virtual nodes (needs root)")
    up.add_argument("--nodes", type=integer(1, 64), required=True, help="number of virtual nodes")
    up.add_argument(
        "--link",
        default=None,
        metavar="LAT,RATE",
        help="shape every node's link with tc netem, e.g. 20us,10gbit (default: unshaped)",
    )
    up.add_argument("--subnet", default="10.213.7", help="first three octets of the /24 to use")
    run = sub.add_parser("run", help="run an MPI job across the virtual nodes")
    run.add_argument(
        "--ppn", type=integer(1, 1 << 10), default=1, help="ranks per virtual node (default 1)"
    )
    run.add_argument(
        "--distribution",
        choices=("block", "cyclic"),
        default="block",
        help="block: ranks 0..ppn-1 on the first node (default); cyclic: rank r on node "
        "r mod nodes (Slurm's --distribution=cyclic)",
    )
    run.add_argument(
        "--timeout",
        type=real(0, above=True),
        default=None,
        metavar="S",
        help="kill the job after S seconds",
    )
    add_restart_arguments(run)
    run.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    run.add_argument("command", nargs=argparse.REMAINDER, help="what every rank runs, after --")
    sub.add_parser("status", help="show the virtual cluster that is up")
    sub.add_parser("down", help="remove every namespace, link and file of the virtual cluster")


def _run(_comm: Any, args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..vcluster.netns import (
        ClusterSpec,
        VClusterError,
        cluster_down,
        cluster_status,
        cluster_up,
    )

    if args.action is None:
        raise UsageError("vcluster: name an action (up, run, status, down)")
    if args.action == "up":
        spec = ClusterSpec(args.nodes, args.link, args.subnet)
        for warning in cluster_up(spec):
            print(f"hpcpar vcluster: warning: {warning}", flush=True)
        names, links = f"vnode0..vnode{spec.nodes - 1}", spec.link or "unshaped"
        print(
            f"vcluster up: {spec.nodes} node(s) {names} on {spec.subnet}.0/24, links {links}",
            flush=True,
        )
        return 0
    if args.action == "down":
        removed = cluster_down()
        print(f"vcluster down: removed {len(removed)} namespace(s) and link(s)", flush=True)
        return 0
    spec = cluster_status()
    if args.action == "status":
        if spec is None:
            print("vcluster: none up", flush=True)
        else:
            links = spec.link or "unshaped"
            print(
                f"vcluster: {spec.nodes} node(s), links {links}, subnet {spec.subnet}.0/24",
                flush=True,
            )
        return 0
    if spec is None:
        raise VClusterError("no virtual cluster is up; run 'hpcpar vcluster up --nodes N' first")
    return _run_job(spec, args, commands().keys())


def _run_job(spec: Any, args: argparse.Namespace, known: Any) -> int:
    from ..errors import UsageError
    from ..launcher import LaunchPlan, oversubscription_env, rank_command
    from ..runtime.mpiinfo import find_mpi
    from ..vcluster.netns import network_env, plan_run

    if args.ppn < 1:
        raise UsageError(f"vcluster run: --ppn must be at least 1, not {args.ppn}")
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    mpi = find_mpi()
    if mpi.vendor != "mpich" or mpi.mpiexec is None:
        raise UsageError(f"vcluster run needs MPICH's hydra mpiexec; this MPI is {mpi.version}")
    cyclic = getattr(args, "distribution", "block") == "cyclic"
    argv = plan_run(spec, args.ppn, rank_command(command, known), mpi.mpiexec, cyclic)
    ranks = spec.nodes * args.ppn
    import os

    from ..runtime.env import usable_cores

    env = oversubscription_env(mpi.vendor, ranks, usable_cores())
    env.update(network_env(os.environ))
    if args.dry_run:
        print(shlex.join(argv), flush=True)
        return 0
    return run_planned(LaunchPlan(argv, env, ranks=ranks), args, args.timeout)


register(
    Command(
        "vcluster",
        "a virtual multi-node cluster on one machine (network namespaces + tc)",
        _add_arguments,
        _run,
        needs_mpi=False,
    )
)
