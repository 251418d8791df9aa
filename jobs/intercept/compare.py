"""Run ``osu_allreduce.py`` as it is and under interception, alternately; print the ratios.

    python jobs/intercept/compare.py -n 2 --repeats 5 [--layout L] [-- OSU OPTIONS]
    python jobs/intercept/compare.py --vcluster-ppn 2 --profile P.json --repeats 5

Each repeat runs the unchanged program twice (library, then under interception);
per size it prints the median time of each and the median and spread (min-max) of the
per-repeat ratio intercepted/library. ``--vcluster-ppn K`` runs both on the virtual
cluster that is up (``hpcpar vcluster up``), K ranks per node; ``--profile`` gives the
intercepted run a cost-model profile calibrated there (``HPCPAR_PROFILE``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROGRAM = str(Path(__file__).with_name("osu_allreduce.py"))


def _run(args: argparse.Namespace, intercept: bool, extra: list[str]) -> dict[int, float]:
    env = dict(os.environ)
    if args.vcluster_ppn:
        command = [sys.executable, "-m", "hpcpar", "vcluster", "run", "--ppn"]
        command += [str(args.vcluster_ppn), "--", "python"]
        command += ["-m", "hpcpar.intercept", PROGRAM] if intercept else [PROGRAM]
    else:
        command = [sys.executable, "-m", "hpcpar", "launch", "-n", str(args.n)]
        if args.layout:
            command += ["--layout", args.layout]
        if intercept:
            command.append("--intercept")
        command += ["--", PROGRAM]
    if intercept and args.profile:
        env["HPCPAR_PROFILE"] = args.profile
    out = subprocess.run(
        [*command, *extra], capture_output=True, text=True, check=True, timeout=900, env=env
    ).stdout
    times = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and not line.startswith("#"):
            times[int(parts[0])] = float(parts[1])
    return times


def main() -> None:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="ranks")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layout", default=None, help="virtual node layout for both runs")
    parser.add_argument(
        "--vcluster-ppn", type=int, default=0, metavar="K", help="run on the virtual cluster"
    )
    parser.add_argument("--profile", default=None, help="HPCPAR_PROFILE for the hpcpar run")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="options for osu_allreduce.py")
    args = parser.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    library: list[dict[int, float]] = []
    hpcpar: list[dict[int, float]] = []
    for _ in range(args.repeats):
        library.append(_run(args, False, extra))
        hpcpar.append(_run(args, True, extra))
    where = (
        f"virtual cluster, {args.vcluster_ppn} per node"
        if args.vcluster_ppn
        else (f"{args.n} ranks, layout {args.layout or 'real'}")
    )
    print(f"# {where}, {args.repeats} repeats, profile {args.profile or 'none'}")
    print(f"# {'Size':>10} {'library us':>11} {'intercepted us':>15} {'ratio':>6} {'spread':>12}")
    for size in library[0]:
        ratios = [h[size] / m[size] for m, h in zip(library, hpcpar, strict=True)]
        print(
            f"  {size:>10} {statistics.median(m[size] for m in library):>11.2f} "
            f"{statistics.median(h[size] for h in hpcpar):>15.2f} "
            f"{statistics.median(ratios):>6.2f} {min(ratios):>5.2f}-{max(ratios):<5.2f}"
        )


if __name__ == "__main__":
    main()
