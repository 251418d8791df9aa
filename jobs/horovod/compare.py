"""Horovod's synthetic benchmark on hpcpar against the same loop under PyTorch DDP.

    python jobs/horovod/compare.py SCRIPT [-n 2] [--repeats 3] [--vcluster-ppn K]
                                   [-- BENCHMARK OPTIONS]

``SCRIPT`` is Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py`` (from a
checkout of https://github.com/horovod/horovod; nothing of it is kept here). Each
repeat runs, one after the other, the script with only its import line changed
(``examples.changed``) under ``with_stats.py``, and ``ddp_synthetic.py`` (the same loop
under DDP over gloo) with the same options; it prints the median images/s of each
and the median and spread (min-max) of the per-repeat ratio hpcpar/DDP, and what the
backward passes hid of hpcpar's gradient communication (rank 0). ``--vcluster-ppn
K`` runs both on the virtual cluster that is up (``hpcpar vcluster up``), K ranks per
node. Run it with a Python that has torchvision beside hpcpar.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from examples import changed  # noqa: E402 (this folder's helper)

TOTAL = re.compile(r"Total img/sec on \d+ CPU\(s\): ([0-9.]+)")
HIDDEN = re.compile(r"# gradients: steps (\d+), reduce ([0-9.]+) s, exposed ([0-9.]+) s")


def _run(args: argparse.Namespace, argv: list[str]) -> str:
    if args.vcluster_ppn:
        command = [sys.executable, "-m", "hpcpar", "vcluster", "run", "--ppn"]
        command += [str(args.vcluster_ppn), "--", *argv]
    else:
        command = [sys.executable, "-m", "hpcpar", "launch", "-n", str(args.n), "--", *argv]
        command[command.index("--") + 1] = sys.executable
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=3600, env=dict(os.environ)
    )
    if done.returncode != 0 or not TOTAL.search(done.stdout):
        sys.exit(f"{' '.join(argv[:2])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    """Parse the options and run the repeats."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", type=Path, help="Horovod's pytorch_synthetic_benchmark.py")
    parser.add_argument("-n", type=int, default=2, help="ranks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vcluster-ppn", type=int, default=0, metavar="K")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    work = Path(tempfile.mkdtemp(prefix="hpcpar-horovod-bench-"))
    script = work / args.script.name
    script.write_text(changed(args.script.read_text()))
    hvd_argv = ["python", str(HERE / "with_stats.py"), str(script), "--no-cuda", *extra]
    ddp_argv = ["python", str(HERE / "ddp_synthetic.py"), "--no-cuda", *extra]
    ours, theirs, hidden = [], [], []
    for _ in range(args.repeats):
        out = _run(args, hvd_argv)
        ours.append(float(TOTAL.search(out).group(1)))
        found = HIDDEN.search(out)
        if found:
            steps, reduce_s, exposed_s = int(found[1]), float(found[2]), float(found[3])
            hidden.append((reduce_s / steps, exposed_s / steps))
        theirs.append(float(TOTAL.search(_run(args, ddp_argv)).group(1)))
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    where = (
        f"virtual cluster, {args.vcluster_ppn} per node"
        if args.vcluster_ppn
        else f"{args.n} ranks on this host"
    )
    print(f"# {where}, {args.repeats} repeats, options: {' '.join(extra) or '(defaults)'}")
    for name, figures in (("hpcpar.horovod", ours), ("DDP (gloo)", theirs)):
        low, high = min(figures), max(figures)
        print(f"  {name:<15} img/s {statistics.median(figures):.1f} ({low:.1f}-{high:.1f})")
    print(f"  ratio {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
    if hidden:
        per_step = statistics.median(r for r, _ in hidden)
        exposed = statistics.median(e for _, e in hidden)
        share = 0.0 if per_step == 0 else max(0.0, 1 - exposed / per_step)
        print(
            f"  hpcpar gradient communication per step: {1e3 * per_step:.1f} ms, exposed "
            f"after the backward pass {1e3 * exposed:.1f} ms ({100 * share:.0f}% hidden)"
        )


if __name__ == "__main__":
    main()
