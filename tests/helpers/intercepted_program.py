"""An mpi4py program that knows nothing of hpcpar, for the whole-job interception tests.

Every rank checks its results against numpy and prints ``ok <rank>``. With ``mismatch``
as its argument, rank 0 passes two float32 to an allreduce where the others pass one
float64 (the same bytes: the library finds nothing wrong); with ``truncate``, rank 0
passes one element fewer than the others; with ``hang``, rank 0 gathers while the
others sleep; with ``threads``, three threads make blocking and nonblocking calls at
once, each on its own communicator (as ``MPI_THREAD_MULTIPLE`` allows).
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
x = np.arange(6, dtype=np.float64) + rank
y = np.empty_like(x)
for _ in range(3):
    comm.Allreduce(x, y, op=MPI.SUM)
assert np.allclose(y, 6 * 0 + np.arange(6) * size + size * (size - 1) / 2)
half = comm.Split(rank % 2, rank)
b = np.full(4, half.Get_rank(), dtype=np.int32)
half.Bcast(b, root=0)
assert (b == 0).all()
req = comm.Iallreduce(MPI.IN_PLACE, y, op=MPI.MAX)
MPI.Request.Waitall([req])
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "mismatch":
    z = np.ones(2, np.float32) if rank == 0 else np.ones(1, np.float64)
    for _ in range(200):
        comm.Allreduce(z, np.empty_like(z))
if mode == "truncate":
    n = 5 if rank == 0 else 6
    for _ in range(200):
        comm.Allreduce(np.ones(n), np.empty(n))
if mode == "hang":
    if rank == 0:
        comm.Allgather(np.zeros(3), np.empty(3 * size))  # the line the watchdog names
    else:
        time.sleep(120)
if mode == "threads":
    comms = [comm.Dup() for _ in range(3)]
    wrong: list[object] = []

    def work(k: int) -> None:
        try:
            for i in range(150):
                x = np.full(1 + (i * 7 + k) % 3000, rank + k, dtype=np.float64)
                got = np.empty_like(x)
                if i % 2:
                    comms[k].Iallreduce(x, got).Wait()
                else:
                    comms[k].Allreduce(x, got)
                if not np.allclose(got, sum(r + k for r in range(size))):
                    wrong.append((k, i))
        except Exception as exc:  # reported below, on this rank
            wrong.append(repr(exc))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong
print(f"ok {rank}", flush=True)
