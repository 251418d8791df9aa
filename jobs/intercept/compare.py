"""Run ``osu_allreduce.py`` as it is and under interception, alternately; print the ratios.

    python jobs/intercept/compare.py -n 2 --repeats 5 [--layout L] [-- OSU OPTIONS]

Each repeat runs the unchanged program twice (library, then ``hpcpar launch
--intercept``); per size it prints the median time of each and the median and spread
(min-max) of the per-repeat ratio intercepted/library.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

PROGRAM = str(Path(__file__).with_name("osu_allreduce.py"))


def _run(ranks: int, intercept: bool, layout: str | None, extra: list[str]) -> dict[int, float]:
    command = [sys.executable, "-m", "hpcpar", "launch", "-n", str(ranks)]
    if layout:
        command += ["--layout", layout]
    if intercept:
        command.append("--intercept")
    out = subprocess.run(
        [*command, "--", PROGRAM, *extra], capture_output=True, text=True, check=True, timeout=600
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
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="options for osu_allreduce.py")
    args = parser.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    library: list[dict[int, float]] = []
    hpcpar: list[dict[int, float]] = []
    for _ in range(args.repeats):
        library.append(_run(args.n, False, args.layout, extra))
        hpcpar.append(_run(args.n, True, args.layout, extra))
    print(f"# {args.n} ranks, layout {args.layout or 'real'}, {args.repeats} repeats")
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
