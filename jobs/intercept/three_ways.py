"""One job, three ways to make the same Allreduce: the library's, intercepted, hpcpar's.

    hpcpar launch -n 2 -- python -m hpcpar.intercept jobs/intercept/three_ways.py \
        --sizes 8,1024,65536 --blocks 9

Under ``python -m hpcpar.intercept`` the program's ``MPI.COMM_WORLD`` is intercepted;
the library's own call runs on a plain ``MPI.Intracomm`` of the same handle, and
``hpcpar.allreduce`` on hpcpar's default communicator. The three alternate in blocks
of calls (OSU-style: 10000 calls up to 8 KiB, 1000 above, after a tenth as many
untimed), so a change in the machine's speed falls on all three alike. Rank 0 prints,
per size, the median time per call of each and the median and spread (min-max) over
the blocks of intercepted minus library, in microseconds, and of the ratio
intercepted/``hpcpar.allreduce``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import hpcpar


def main() -> None:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,1024,65536,1048576", help="bytes")
    parser.add_argument("--blocks", type=int, default=9, help="blocks of each way")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if type(comm) is MPI.Intracomm:
        raise SystemExit("three_ways.py: run it under python -m hpcpar.intercept")
    plain = MPI.Intracomm(comm)
    rank = comm.Get_rank()
    if rank == 0:
        print(f"# {comm.Get_size()} ranks, float32 SUM, {args.blocks} blocks of each way")
        print(
            f"# {'bytes':>8} {'library us':>11} {'intercepted us':>15} {'hpcpar us':>10}"
            f" {'added us (spread)':>22} {'vs hpcpar (spread)':>22}"
        )
    for size in (int(s) for s in args.sizes.split(",")):
        send = np.ones(max(1, size // 4), dtype=np.float32)
        recv = np.empty_like(send)
        calls = 10000 if size <= 8192 else 1000
        ways = {
            "library": lambda s=send, r=recv: plain.Allreduce(s, r, op=MPI.SUM),
            "intercepted": lambda s=send, r=recv: comm.Allreduce(s, r, op=MPI.SUM),
            "hpcpar": lambda s=send, r=recv: hpcpar.allreduce(s, out=r),
        }
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.blocks):
            for way, call in ways.items():
                for _ in range(calls // 10):
                    call()
                plain.Barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                took = np.array([(time.perf_counter() - start) / calls * 1e6])
                plain.Allreduce(MPI.IN_PLACE, took, op=MPI.MAX)
                times[way].append(float(took[0]))
        if recv[0] != comm.Get_size():
            raise SystemExit(f"three_ways.py: wrong result {recv[0]}")
        if rank == 0:
            added = [i - b for i, b in zip(times["intercepted"], times["library"], strict=True)]
            ratio = [i / h for i, h in zip(times["intercepted"], times["hpcpar"], strict=True)]
            med = {way: statistics.median(t) for way, t in times.items()}
            print(
                f"  {size:>8} {med['library']:>11.2f} {med['intercepted']:>15.2f}"
                f" {med['hpcpar']:>10.2f} {statistics.median(added):>+8.2f}"
                f" ({min(added):+.2f}..{max(added):+.2f})"
                f" {statistics.median(ratio):>8.2f} ({min(ratio):.2f}-{max(ratio):.2f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
