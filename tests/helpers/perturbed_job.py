"""A job of random collectives in which one rank changes one call (tests of the guard).

``python perturbed_job.py SEED KIND AT VICTIM ALGORITHM``: every rank runs the same
random sequence of allreduces and broadcasts (blocking and nonblocking), except that
rank ``VICTIM`` changes call ``AT``: its count (``count-up``, ``count-down``) or, for a
broadcast, its root (``root``). Each rank checks every result against what the
unperturbed sequence must give and prints ``WRONG #i`` for any that differs; a rank
that gets through the whole sequence prints ``done``. A run that ends without a report
and with a wrong result is the guard's failure.
"""

from __future__ import annotations

import sys

import numpy as np

import hpcpar

CALLS = 300


def sequence(seed: int, size: int) -> list[tuple[str, bool, int, int]]:
    """(collective, blocking, count, root) per call, the same on every rank."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(CALLS):
        kind = "bcast" if rng.random() < 0.4 else "allreduce"
        out.append((kind, bool(rng.random() < 0.7), int(rng.integers(1, 300)), i % size))
    return out


def main() -> None:
    seed, kind, at, victim, algorithm = (
        int(sys.argv[1]),
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        sys.argv[5],
    )
    comm = hpcpar.default_comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    calls = sequence(seed, size)
    if kind == "root":  # the call that changes is a broadcast
        calls[at] = ("bcast", *calls[at][1:])
    for i, (name, blocking, count, common_root) in enumerate(calls):
        root = common_root
        n = count
        if i == at and rank == victim:
            if kind == "count-up":
                n = count + 1 + at % 7
            elif kind == "count-down":
                n = count - 1 - at % 7 if count > 8 else count + 1
            else:
                root = (root + 1) % size
        if name == "allreduce":
            x = np.full(n, 1.0 + rank)
            if blocking:
                out = hpcpar.allreduce(x, algorithm=algorithm)
            else:
                out = hpcpar.iallreduce(x, algorithm=algorithm).wait()
            want = np.full(count, size * (size + 1) / 2)
        else:
            x = np.full(n, float(i + 1)) if rank == root else np.zeros(n)
            if blocking:
                out = hpcpar.bcast(x, root=root, algorithm=algorithm)
            else:
                out = hpcpar.ibcast(x, root=root, algorithm=algorithm).wait()
            want = np.full(count, float(i + 1))
        if out.shape != want.shape or not np.array_equal(out, want):
            print(f"WRONG #{i} on rank {rank}", flush=True)
    print(f"done on rank {rank}", flush=True)


if __name__ == "__main__":
    main()
