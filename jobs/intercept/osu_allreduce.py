"""An unchanged mpi4py program: OSU-style latency of ``comm.Allreduce`` in a loop.

It knows nothing of hpcpar. Run it as it is, or under interception, and compare:

    hpcpar launch -n 2 -- jobs/intercept/osu_allreduce.py
    hpcpar launch -n 2 --intercept -- jobs/intercept/osu_allreduce.py

``jobs/intercept/compare.py`` runs both, alternately, and prints the ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,1024,16384,262144,4194304", help="bytes")
    # the OSU micro-benchmarks' defaults: 10000 timed calls after 1000 untimed up to
    # 8 KiB (their LARGE_MESSAGE_SIZE), 1000 after 100 above
    parser.add_argument("--iterations", type=int, default=10000, help="timed calls up to 8 KiB")
    parser.add_argument("--warmup", type=int, default=1000, help="untimed calls up to 8 KiB")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if rank == 0:
        print(f"# OSU-style MPI Allreduce latency, {comm.Get_size()} ranks, float32 SUM")
        print(f"# {'Size':>10} {'Avg(us)':>12} {'Iterations':>11}")
    for size in (int(s) for s in args.sizes.split(",")):
        count = max(1, size // 4)
        send = np.ones(count, dtype=np.float32)
        recv = np.empty_like(send)
        large = size > 8192
        iterations = max(1, args.iterations // 10) if large else args.iterations
        for _ in range(max(1, args.warmup // 10) if large else args.warmup):
            comm.Allreduce(send, recv, op=MPI.SUM)
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            comm.Allreduce(send, recv, op=MPI.SUM)
        elapsed = time.perf_counter() - start
        if recv[0] != comm.Get_size():
            raise SystemExit(f"wrong result: {recv[0]}")
        mean = np.array([elapsed / iterations * 1e6])
        comm.Allreduce(MPI.IN_PLACE, mean, op=MPI.MAX)
        if rank == 0:
            print(f"  {count * 4:>10} {mean[0]:>12.2f} {iterations:>11}")


if __name__ == "__main__":
    main()
