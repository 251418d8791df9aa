"""``hpcpar calibrate``: measure this machine's profile in a few seconds and write it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..plugins import Command, register
from .common import add_layout_argument, integer, output_path

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        type=output_path,
        default="hpcpar-profile.json",
        metavar="FILE",
        help="where to write the profile (default hpcpar-profile.json)",
    )
    parser.add_argument(
        "--repeats", type=integer(1, 1 << 20), default=9, help="repeats per measurement (default 9)"
    )
    add_layout_argument(parser)


def _run(comm: Any, args: argparse.Namespace) -> int:
    from ..collectives.cost.calibrate import calibrate
    from ..errors import UsageError
    from ..topology import Hierarchy

    if args.repeats < 1:
        raise UsageError(f"calibrate: --repeats must be at least 1, not {args.repeats}")
    with Hierarchy(comm, layout=args.layout) as h:
        profile = calibrate(comm, h, repeats=args.repeats)
    if comm.Get_rank() == 0:
        from pathlib import Path

        from ..runtime.results import atomic_write

        atomic_write(Path(args.output), json.dumps(profile.to_json(), indent=2) + "\n")
        ms = 1e6
        print(f"profile: {profile.name}")
        print(
            f"  intra-node: alpha {profile.intra.alpha_s * ms:.2f} us, "
            f"{1 / profile.intra.beta_s_per_byte / 1e9:.2f} GB/s"
        )
        print(
            f"  inter-node: alpha {profile.inter.alpha_s * ms:.2f} us, "
            f"{1 / profile.inter.beta_s_per_byte / 1e9:.2f} GB/s"
        )
        print(f"  reduction:  {1 / profile.gamma_s_per_byte / 1e9:.2f} GB/s (numpy add)")
        codecs = ", ".join(f"{k} {1 / v / 1e9:.2f}" for k, v in profile.codecs.items())
        print(f"  codecs:     {codecs} GB/s of float32 (code + decode)")
        per_call, per_round = profile.call_s * ms, profile.step_s * ms
        print(
            f"  hpcpar:     {per_call:.2f} us per call, {per_round:.2f} us per round; "
            f"{profile.library_call_s * ms:.2f} us on a library call"
        )
        if profile.oversubscribed:
            print("  oversubscribed: more ranks than cores on a machine (no pipelined overlap)")
        print(f"written to {args.output}; use it with HPCPAR_PROFILE={args.output}", flush=True)
    return 0


register(
    Command(
        "calibrate",
        "measure this machine's cost-model profile (alpha, beta, gamma per level)",
        _add_arguments,
        _run,
    )
)
