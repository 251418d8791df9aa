"""``hpcpar explain COLLECTIVE SIZE``: the algorithm auto picks, the predictions, the reason."""

from __future__ import annotations

import argparse
from typing import Any

from ..collectives.names import COLLECTIVES
from ..plugins import Command, register
from .common import add_layout_argument, integer, real

__all__ = ["add_machine_arguments", "machine_layout", "machine_profile"]


def add_machine_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that describe a machine: a profile, or a network, and a node grid."""
    parser.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="machine profile from 'hpcpar calibrate' (default: $HPCPAR_PROFILE)",
    )
    parser.add_argument(
        "--network",
        default=None,
        metavar="LAT,BW",
        help="inter-node latency and bandwidth instead of a profile, e.g. 2us,25GB/s",
    )
    parser.add_argument(
        "--intra",
        default=None,
        metavar="LAT,BW",
        help="intra-node latency and bandwidth with --network (default 0.5us,10GB/s)",
    )


def machine_profile(args: argparse.Namespace) -> Any:
    """The profile the options describe (``--profile``, ``--network``, or the environment's)."""
    from dataclasses import replace

    from ..errors import UsageError
    from ..runtime.profile import (
        active_profile,
        default_profile,
        load_profile,
        parse_network,
    )

    if args.profile and args.network:
        raise UsageError("give --profile or --network, not both")
    if args.profile:
        return load_profile(args.profile)
    base = active_profile() or default_profile()
    if args.network:
        intra = parse_network(args.intra) if args.intra else default_profile().intra
        return replace(
            default_profile(),
            name=f"network {args.network}",
            inter=parse_network(args.network),
            intra=intra,
        )
    if args.intra:
        raise UsageError("--intra goes with --network")
    return base


def machine_layout(nodes: int, ppn: int) -> Any:
    """An even layout of ``nodes`` nodes with ``ppn`` ranks each."""
    from ..collectives.tally import Layout
    from ..errors import UsageError

    if nodes < 1 or ppn < 1:
        raise UsageError(f"--nodes and --ppn must be at least 1 (got {nodes} and {ppn})")
    return Layout(tuple(r // ppn for r in range(nodes * ppn)))


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("collective", choices=COLLECTIVES)
    parser.add_argument("size", help="message size, e.g. 8, 64KiB, 1MiB")
    parser.add_argument(
        "--itemsize", type=integer(1, 1 << 20), default=8, help="element size in bytes (default 8)"
    )
    parser.add_argument(
        "--nodes",
        type=integer(1, 1 << 20),
        default=None,
        help="explain for a machine of N nodes ...",
    )
    parser.add_argument(
        "--ppn",
        type=integer(1, 1 << 16),
        default=None,
        help="... with K ranks each (instead of this job)",
    )
    parser.add_argument(
        "--model",
        action="store_true",
        help="show the model's choice even without a calibrated profile",
    )
    parser.add_argument(
        "--compression",
        default=None,
        help="also rank the compression schemes of an allreduce: auto, fp16, bf16, int8, 1bit",
    )
    parser.add_argument(
        "--tolerance",
        type=real(0, above=True),
        default=None,
        help="the largest error bound to accept (with --compression auto)",
    )
    parser.add_argument(
        "--block", type=integer(1, 1 << 30), default=None, help="compression block size"
    )
    add_machine_arguments(parser)
    add_layout_argument(parser)


def _run(comm: Any, args: argparse.Namespace) -> int:
    from ..collectives.cost.explain import plan_for
    from ..collectives.tally import Layout
    from ..errors import UsageError
    from ..runtime.units import parse_size
    from ..topology import Hierarchy

    nbytes = parse_size(args.size)
    if args.itemsize < 1:
        raise UsageError(f"explain: --itemsize must be at least 1, not {args.itemsize}")
    profile = machine_profile(args)
    if (args.nodes is None) != (args.ppn is None):
        raise UsageError("explain: give both --nodes and --ppn, or neither")
    if args.nodes is not None:
        layout = machine_layout(args.nodes, args.ppn)
    else:
        with Hierarchy(comm, layout=args.layout) as h:
            layout = Layout(tuple(h.node_of))
    spec = None
    if args.compression is not None or args.tolerance is not None or args.block is not None:
        from ..collectives.compression import DEFAULT_BLOCK, Compression, as_compression
        from ..collectives.errors import CollectiveError

        try:
            spec = as_compression(
                Compression(args.compression or "auto", args.block or DEFAULT_BLOCK),
                args.tolerance,
            )
        except CollectiveError as exc:
            raise UsageError(f"explain: {exc}") from None
        if args.itemsize not in (4, 8):
            raise UsageError("explain: compression needs --itemsize 4 or 8 (float32, float64)")
    plan = plan_for(
        args.collective,
        nbytes,
        layout,
        profile,
        itemsize=args.itemsize,
        calibrated_only=not (args.model or args.network or args.profile),
        compression=spec,
    )
    if comm.Get_rank() == 0:
        print(plan, flush=True)
    return 0


register(
    Command(
        "explain",
        "the algorithm auto picks for a collective, predicted times and why",
        _add_arguments,
        _run,
    )
)
