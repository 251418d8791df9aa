"""``hpcpar bench collectives --vcluster NxK``: the whole virtual-cluster sweep in one command.

Brings up (or reuses) a virtual cluster of N nodes, calibrates a profile on it with K
ranks per node unless ``--profile`` names one, then runs the same benchmark inside it
(every algorithm, ``auto`` and the library's call, with the model's prediction for the
profile), and takes the cluster down again if it brought it up. Started as one process:
it launches the ranks itself, through ``hpcpar vcluster run``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import HpcparError, UsageError
from .harness import Measurement

__all__ = ["add_vcluster_arguments", "rerun_on_vcluster", "run_on_vcluster"]


def add_vcluster_arguments(parser: argparse.ArgumentParser, profile: str = "--profile") -> None:
    """``--vcluster``, ``--link`` and ``--distribution`` (``profile``: what names one)."""
    parser.add_argument(
        "--vcluster",
        default=None,
        metavar="NxK",
        help="run on a virtual cluster of N nodes x K ranks (brought up and down here; "
        f"calibrates a profile first unless {profile} is given; needs root)",
    )
    parser.add_argument(
        "--link",
        default="20us,1gbit",
        metavar="LAT,RATE",
        help="with --vcluster: the shaped links (default 20us,1gbit)",
    )
    parser.add_argument(
        "--distribution",
        choices=("block", "cyclic"),
        default="block",
        help="with --vcluster: rank placement over the nodes (default block)",
    )


def _shape(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if match is None or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise UsageError(f"--vcluster: expected NODESxRANKS such as 2x2, not {text!r}")
    return int(match.group(1)), int(match.group(2))


def _inner_options(args: argparse.Namespace, profile: str, output: str) -> list[str]:
    """The benchmark's own options for the run inside the cluster."""
    out = [
        "--collective",
        args.collective,
        "--min-size",
        args.min_size,
        "--max-size",
        args.max_size,
        "--repeats",
        str(args.repeats),
        "--warmup",
        str(args.warmup),
        "--min-time",
        str(args.min_time),
        "--max-iterations",
        str(args.max_iterations),
        "--profile",
        profile,
        "--output",
        output,
    ]
    if args.algorithms:
        out += ["--algorithms", args.algorithms]
    if getattr(args, "compression", None):
        out += ["--compression", args.compression, "--tolerance", str(args.tolerance)]
        if args.block:
            out += ["--block", str(args.block)]
    if args.no_gloo:
        out.append("--no-gloo")
    return out


def run_on_vcluster(comm: Any, args: argparse.Namespace) -> list[Measurement]:
    """Run the sweep on the virtual cluster; its rows (the run there wrote the output).

    Raises:
        UsageError: started on more than one rank, a layout given, a bad shape.
        HpcparError: the calibration or the benchmark failed on the cluster.
    """
    from ..vcluster.netns import ClusterSpec, cluster, parse_link

    if comm.Get_size() != 1:
        raise UsageError(
            "bench collectives --vcluster: start it as one process; "
            "it launches the ranks on the virtual nodes itself"
        )
    if args.layout:
        raise UsageError("bench collectives --vcluster: the nodes are real there; drop --layout")
    nodes, ppn = _shape(args.vcluster)
    parse_link(args.link)
    hpcpar = [sys.executable, "-m", "hpcpar"]
    prefix = args.output or str(Path(tempfile.mkdtemp(prefix="hpcpar-vc-")) / "collectives")
    place = ["vcluster", "run", "--ppn", str(ppn), "--distribution", args.distribution]
    with cluster(ClusterSpec(nodes, args.link), "bench collectives --vcluster") as warnings:
        for warning in warnings:
            print(f"hpcpar bench: warning: {warning}", flush=True)
        profile = args.profile
        if profile is None:
            profile = f"{prefix}-profile.json"
            calibrate = ["calibrate", "--output", profile, "--repeats", "5"]
            _step(hpcpar + place + ["--timeout", "900", "--"] + calibrate, "calibration")
        inner = ["bench", "collectives", *_inner_options(args, profile, prefix)]
        env = dict(os.environ, HPCPAR_PROFILE=profile)
        _step(hpcpar + place + ["--timeout", "5400", "--"] + inner, "benchmark", env)
    args.output = None  # written by the run on the cluster, with its metadata
    rows = json.loads(Path(f"{prefix}.json").read_text())["results"]
    return [Measurement(**row) for row in rows]


def rerun_on_vcluster(comm: Any, args: argparse.Namespace, bench: str, size_key: str) -> list[Any]:
    """Run this same ``hpcpar bench BENCH`` command inside a virtual cluster; its rows.

    The command line is this process's, less ``--vcluster``, ``--link``,
    ``--distribution`` and ``--output``; the cluster is brought up (or reused) as for
    ``bench collectives --vcluster``, and a profile calibrated on it first unless
    ``HPCPAR_PROFILE`` names one, so that ``auto`` and the cost model see its links.

    Raises:
        UsageError: started on more than one rank, a layout given, a bad shape.
        HpcparError: the calibration or the benchmark failed on the cluster.
    """
    from ..vcluster.netns import ClusterSpec, cluster, parse_link
    from .harness import Row

    who = f"bench {bench} --vcluster"
    if comm.Get_size() != 1:
        raise UsageError(f"{who}: start it as one process; it launches the ranks itself")
    if args.layout:
        raise UsageError(f"{who}: the nodes are real there; drop --layout")
    nodes, ppn = _shape(args.vcluster)
    parse_link(args.link)
    inner = _own_arguments(sys.argv, bench)
    hpcpar = [sys.executable, "-m", "hpcpar"]
    prefix = args.output or str(Path(tempfile.mkdtemp(prefix="hpcpar-vc-")) / bench)
    place = ["vcluster", "run", "--ppn", str(ppn), "--distribution", args.distribution]
    env = dict(os.environ)
    with cluster(ClusterSpec(nodes, args.link), who) as warnings:
        for warning in warnings:
            print(f"hpcpar bench: warning: {warning}", flush=True)
        if not env.get("HPCPAR_PROFILE"):
            env["HPCPAR_PROFILE"] = f"{prefix}-profile.json"
            calibrate = ["calibrate", "--output", env["HPCPAR_PROFILE"], "--repeats", "5"]
            _step(hpcpar + place + ["--timeout", "900", "--"] + calibrate, "calibration", who=who)
        run = ["bench", bench, *inner, "--output", prefix]
        _step(hpcpar + place + ["--timeout", "5400", "--"] + run, "benchmark", env, who)
    args.output = None  # written by the run on the cluster, with its metadata
    rows = json.loads(Path(f"{prefix}.json").read_text())["results"]
    return [Row(row, size_key=size_key) for row in rows]


def _own_arguments(argv: list[str], bench: str) -> list[str]:
    """The arguments after ``bench BENCH`` in ``argv``, less the cluster's and --output."""
    try:
        at = next(i for i in range(len(argv) - 1) if argv[i : i + 2] == ["bench", bench])
    except StopIteration:
        raise UsageError(
            f"bench {bench} --vcluster: cannot find 'bench {bench}' in the "
            "command line to run it again inside the cluster"
        ) from None
    drop = ("--vcluster", "--link", "--distribution", "--output")
    out, rest = [], argv[at + 2 :]
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in drop:
            i += 2
            continue
        if not word.startswith(tuple(f"{d}=" for d in drop)):
            out.append(word)
        i += 1
    return out


def _step(
    argv: list[str],
    what: str,
    env: dict[str, str] | None = None,
    who: str = "bench collectives --vcluster",
) -> None:
    code = subprocess.run(argv, env=env, check=False).returncode
    if code != 0:
        raise HpcparError(f"{who}: the {what} failed (exit {code})")
