"""The cost of a small ``hvd.allreduce`` over ``hpcpar.allreduce`` on the same buffer.

    hpcpar launch -n 2 -- python jobs/horovod/small_calls.py [--elements 2] [--blocks 7]

In one job, blocks of ``--calls`` calls of each form alternate: ``hpcpar.allreduce``
(in place, the tensor's numpy view), ``hvd.allreduce_`` (in place), ``hvd.allreduce``
(a new tensor) and ``hvd.allreduce(op=hvd.Sum)``, on a float32 tensor of
``--elements`` elements (2: 8 bytes). Rank 0 prints each form's median time per call
over the blocks, its spread (min-max) and its difference from ``hpcpar.allreduce``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from mpi4py import MPI

import hpcpar
import hpcpar.horovod.torch as hvd
from hpcpar.horovod import basics


def main() -> None:
    """Parse the options, time the blocks, print the table on rank 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--blocks", type=int, default=7)
    args = parser.parse_args()
    hvd.init()
    t = torch.ones(args.elements)
    a = t.numpy()
    comm = basics.set_comm(hvd.global_process_set)
    forms = {
        "hpcpar.allreduce": lambda: hpcpar.allreduce(a, MPI.SUM, out=a, comm=comm),
        "hvd.allreduce_": lambda: hvd.allreduce_(t),
        "hvd.allreduce": lambda: hvd.allreduce(t),
        "hvd.allreduce Sum": lambda: hvd.allreduce(t, op=hvd.Sum),
    }
    times: dict[str, list[float]] = {name: [] for name in forms}
    for call in forms.values():  # warm-up
        for _ in range(1000):
            call()
    for _ in range(args.blocks):
        for name, call in forms.items():
            hvd.barrier()
            began = time.perf_counter()
            for _ in range(args.calls):
                call()
            times[name].append((time.perf_counter() - began) / args.calls * 1e6)
    if hvd.rank() == 0:
        base = statistics.median(times["hpcpar.allreduce"])
        print(
            f"# {hvd.size()} ranks, {4 * args.elements} bytes, {args.blocks} blocks of {args.calls}"
        )
        print(f"# {'form':<20} {'us/call':>8} {'spread':>14} {'added us':>9}")
        for name, got in times.items():
            mid = statistics.median(got)
            print(f"  {name:<20} {mid:8.2f} {min(got):6.2f}-{max(got):<7.2f} {mid - base:+9.2f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
