"""A job that hangs on purpose, for the watchdog tests: ``watchdog_job.py MODE [ARG]``.

Every rank runs three allreduces (#0-#2), then MODE decides what goes wrong on which rank;
rank 0 prints ``hang from T`` (seconds since the epoch) when the others start waiting.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

import hpcpar


def stuck_in_a_named_function():
    time.sleep(120)


def main() -> None:
    mode = sys.argv[1]
    comm = hpcpar.default_comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    last = size - 1
    for _ in range(3):
        hpcpar.allreduce(np.ones(3))
    if rank == 0:
        print(f"hang from {time.time()}", flush=True)
    if mode == "allreduce":
        if rank == last:
            stuck_in_a_named_function()
        hpcpar.allreduce(np.ones(3))
    elif mode == "barrier":
        if rank == last:
            stuck_in_a_named_function()
        hpcpar.barrier()
    elif mode == "checkpoint":
        from checkpoint import Checkpointer

        root = comm.bcast(tempfile.mkdtemp() if rank == 0 else None, root=0)
        with Checkpointer(root, comm=comm) as ck:
            if rank == last:
                stuck_in_a_named_function()
            ck.save(1, {"w": np.ones(4)}).wait()
    elif mode == "exit":
        if rank == 1:
            sys.exit(0)
        hpcpar.allreduce(np.ones(3))
    elif mode == "os_exit":
        if rank == 1:
            os._exit(0)
        hpcpar.allreduce(np.ones(3))
    elif mode == "mismatch":  # rank 0 reduces, the others broadcast: never matched
        # at #4, between two of the mismatch guard's comparisons (after #3, at #7), so
        # the ranks wait for each other; "guarded": at #3, where the guard compares
        if sys.argv[2:] != ["guarded"]:
            hpcpar.allreduce(np.ones(3))
        if rank == 0:
            hpcpar.allreduce(np.ones(3))
        else:
            hpcpar.bcast(np.ones(5), root=0)
    elif mode == "counts":  # the same collective, a different count on rank 0 (at #4)
        algorithm = sys.argv[2] if len(sys.argv) > 2 else "auto"
        hpcpar.allreduce(np.ones(3))
        hpcpar.allreduce(np.ones(3 if rank == 0 else 5), algorithm=algorithm)
    elif mode == "compute":  # every rank busy longer than the limit: no waiting
        time.sleep(float(sys.argv[2]))
        hpcpar.allreduce(np.ones(3))
    elif mode == "late":  # the last rank joins after a while
        if rank == last:
            time.sleep(float(sys.argv[2]))
        hpcpar.allreduce(np.ones(3))
    elif mode == "slow":  # the last rank starts every collective late
        for _ in range(20):
            if rank == last:
                time.sleep(float(sys.argv[2]))
            hpcpar.allreduce(np.ones(3))
    elif mode == "rank0_done":  # world rank 0 finishes; the others then hang without it
        sub = comm.Split(0 if rank else MPI.UNDEFINED)
        if rank == 0:
            pass
        elif size == 2:
            hpcpar.allreduce(np.ones(3))  # rank 0 never comes
        else:  # on a communicator without rank 0, whose last rank never comes
            if rank == last:
                stuck_in_a_named_function()
            hpcpar.barrier(comm=sub)
    elif mode == "torch_overlap":  # DataParallel reducing on its thread; the last rank
        import torch  # never runs its backward pass
        from hpcpar.apps.sgd.torch import DataParallel

        torch.manual_seed(0)
        model = DataParallel(torch.nn.Linear(64, 8), overlap=True)
        loss = model(torch.ones(16, 64)).square().sum()
        if rank == last:
            stuck_in_a_named_function()
        loss.backward()
    elif mode == "mpi4py_staggered":  # the library's own Barrier, entered at other times;
        if rank == last:  # the last rank never comes
            stuck_in_a_named_function()
        time.sleep(1.0 if rank else 0.0)
        MPI.COMM_WORLD.Barrier()
    elif mode == "mpi4py":  # the MPI library called directly
        x, y = np.ones(4), np.empty(4)
        if rank == last:
            stuck_in_a_named_function()
        MPI.COMM_WORLD.Allreduce(x, y)
    print(f"rank {rank} finished", flush=True)


if __name__ == "__main__":
    main()
