"""A small deterministic job that checkpoints every step and resumes after a crash.

    ckpt_job.py ROOT STEPS LEVELS LAYOUT OUT

Each rank holds x (seeded by its rank); every step x <- 0.5 x + mean over ranks of
sin(x), through hpcpar.allreduce (reproducible, so the bits do not depend on
the algorithm chosen). Every step is saved (without waiting: the next save
drains the previous flush). On start the newest recoverable version is restored;
rank 0 prints ``resumed STEP LEVELS`` (or ``fresh``) and at the end writes every rank's
final x to OUT (a .npy file). ``CKPT_JOB_DIE=STEP`` kills rank 1 between saves, in the
computation of STEP, in the job's first start (``HPCPAR_RESTART`` unset or 0).
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
from hpcpar.checkpoint import Checkpointer, CheckpointError

import hpcpar

N = 1000


def initial(rank: int) -> np.ndarray:
    return np.random.default_rng([rank, 11]).standard_normal(N)


def main() -> None:
    root, steps, levels, layout, out = sys.argv[1:6]
    comm = hpcpar.default_comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    with (
        hpcpar.Hierarchy(comm, layout=layout) as h,
        Checkpointer(root, comm=h, levels=levels.split(",")) as ck,
    ):
        try:
            start, state = ck.restore()
            x = state["x"]
            if rank == 0:
                print("resumed", start, ",".join(ck.restored_from), flush=True)
        except CheckpointError:
            start, x = 0, initial(rank)
            if rank == 0:
                print("fresh", flush=True)
        die = int(os.environ.get("CKPT_JOB_DIE", "0"))
        first = os.environ.get("HPCPAR_RESTART", "0") == "0"
        for step in range(start + 1, int(steps) + 1):
            if step == die and first and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            x = 0.5 * x + hpcpar.allreduce(np.sin(x), comm=comm, reproducible=True) / size
            ck.save(step, {"x": x, "step": step})
    everyone = comm.gather(x, root=0)
    if rank == 0:
        np.save(out, np.stack(everyone), allow_pickle=False)


if __name__ == "__main__":
    main()
