"""Horovod's ``join``: ranks that run out of data keep serving the others' gradient steps.

Every ``DistributedOptimizer`` step on the global process set starts with one small
control allreduce on a communicator of its own (four integers; ``hpcpar bench
horovod`` measures the step it is part of): ranks still training send which optimizer
is stepping, a rank inside ``join`` sends that it has joined. A joined rank takes part
in each step it hears of with zero gradients, as Horovod's joined ranks do (the
average still divides by the set's size), until every rank has joined. As in Horovod,
only the gradients' allreduce is served: sparse gradients (gathered, not reduced) with
a joined rank are an error on every rank, and a script's own collectives must wait
until ``join`` returns on every rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .. import basics
from ..basics import HorovodInternalError

__all__ = ["join", "control_round"]

ACTIVE, OPTIMIZER, JOINED, SPARSE = range(4)


def control_round(optimizer_id: int, sparse: bool) -> None:
    """A training rank's side of a step's control allreduce (collective on the job)."""
    st = basics.state()
    ctl = np.array([1, optimizer_id + 1, 0, int(sparse)], np.int64)
    st.control.Allreduce(MPI.IN_PLACE, ctl, op=MPI.MAX)
    st.rounds += 1
    _refuse_sparse(ctl)


def _refuse_sparse(ctl: Any) -> None:
    if ctl[JOINED] and ctl[SPARSE]:
        raise HorovodInternalError(
            "Allgather is not supported with Join at this time. Specify "
            "sparse_as_dense=True if using DistributedOptimizer"
        )


def join(device: int = -1) -> int:
    """This rank has no more data: serve the others' steps until every rank has joined.

    Returns the rank that joined last (of those joining in the same step, the highest).
    """
    st = basics.state()
    joined_at = st.rounds
    while True:
        ctl = np.array([0, 0, 1, 0], np.int64)
        st.control.Allreduce(MPI.IN_PLACE, ctl, op=MPI.MAX)
        if not ctl[ACTIVE]:
            break
        st.rounds += 1
        _refuse_sparse(ctl)
        optimizer = st.optimizers[int(ctl[OPTIMIZER]) - 1]()
        if optimizer is None:
            raise HorovodInternalError(
                f"join: the ranks still training step optimizer {int(ctl[OPTIMIZER]) - 1}, "
                "which this rank no longer has"
            )
        optimizer._serve_joined()
    size, me = st.comm.Get_size(), st.comm.Get_rank()
    last = np.array([joined_at * size + me], np.int64)
    st.control.Allreduce(MPI.IN_PLACE, last, op=MPI.MAX)
    return int(last[0] % size)
