"""The markdown table of BENCHMARKS.md's virtual-cluster section, from one run's files.

Usage: python jobs/local/vcluster_table.py RESULTS.json PROFILE.json [block|cyclic] [NxK]
(the files ``jobs/local/vcluster-bench.sh`` writes; N nodes x K ranks, default 2x2).
"""

from __future__ import annotations

import json
import sys

from hpcpar.collectives.cost.explain import plan_for
from hpcpar.collectives.tally import Layout
from hpcpar.runtime.profile import load_profile

_TUNED = ("mpi-direct", "auto", "autotune", "auto-persistent", "mpi-persistent")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else (f"{n >> 10} KiB" if n >= 1024 else f"{n} B")


def main(results: str, profile: str, distribution: str = "block", shape: str = "2x2") -> None:
    """Print the table for one run (``distribution``: how its ranks were placed)."""
    nodes, ppn = (int(x) for x in shape.lower().split("x"))
    with open(results) as handle:
        rows_all = json.load(handle)["results"]
    prof = load_profile(profile)
    ranks = range(nodes * ppn)
    layout = Layout(tuple(r % nodes if distribution == "cyclic" else r // ppn for r in ranks))
    print(
        "| size | MPI direct us | mpi via hpcpar / MPI | auto us (ran) | auto/MPI "
        "| auto-persistent/MPI (library's persistent/MPI) | autotune/MPI | best fixed (us) "
        "| regret auto, autotune | measured top-3 | predicted top-3 | pred/meas best |"
    )
    print("|---:|---:|---:|---|---:|---|---:|---|---|---|---|---:|")
    for size in sorted({r["size"] for r in rows_all}):
        rows = {r["variant"]: r for r in rows_all if r["size"] == size}
        plan = plan_for("allreduce", size, layout, prof)
        fixed = {k: v["avg_us"] for k, v in rows.items() if k not in _TUNED}
        best = min(fixed, key=fixed.get)
        measured = sorted(fixed, key=fixed.get)[:3]
        predicted = [p.algorithm for p in plan.ranking[:3]]
        pb = next(p.seconds for p in plan.ranking if p.algorithm == best) * 1e6
        a, m, t = (rows[k]["avg_us"] for k in ("auto", "mpi-direct", "autotune"))
        persistent = rows["auto-persistent"]["avg_us"] / m
        library = rows["mpi-persistent"]["avg_us"] / m
        print(
            f"| {_size(size)} | {m:.0f} | {rows['mpi']['avg_us'] / m:.2f} | {a:.0f} "
            f"({plan.algorithm}) | {a / m:.2f} | {persistent:.2f} ({library:.2f}) | {t / m:.2f} "
            f"| {best} ({fixed[best]:.0f}) | {a / fixed[best]:.2f}, {t / fixed[best]:.2f} "
            f"| {', '.join(measured)} | {', '.join(predicted)} | {pb / fixed[best]:.2f} |"
        )


if __name__ == "__main__":
    main(*sys.argv[1:5])
