"""Online autotuning of ``auto``: time the model's best candidates on first use, keep the winner.

The cost model is only as good as its profile, and on a busy or oversubscribed machine
algorithms it predicts within a few per cent of each other can measure far apart. With
``HPCPAR_AUTOTUNE=1`` (or ``allreduce(..., autotune=True)``), the first ``auto``
allreduce of each size class (bytes rounded down to a power of two), element type and
op kind on a communicator runs the MPI library's call and the model's three best other
candidates on the call's own data into a scratch buffer (the caller's arrays are not
touched), in three loops of as many calls as fit about ``BUDGET_S`` (1 to 10 calls
each, the count agreed by all ranks; the fastest loop counts, so a moment when the
machine was busy does not decide; each loop starts on all ranks together and is timed
on its slowest rank), and keeps the fastest for the rest of the run. One allreduce
of the timings makes every rank keep the same winner. Collective, like the call it
tunes; later calls of the size class cost one dictionary lookup.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from ..runtime.env import getenv_fast
from ..runtime.settings import flag_of, raw_key
from .registry import LIBRARY
from .state import fast_state

__all__ = [
    "BUDGET_S",
    "CANDIDATES",
    "ROUNDS",
    "autotune_on",
    "measure_calls",
    "tuned_algorithm",
    "tuned",
]

BUDGET_S = 0.03  # per candidate
ROUNDS = 3  # loops of calls per candidate; the fastest loop counts
CANDIDATES = 3  # besides the library's call
_KEY = raw_key("HPCPAR_AUTOTUNE")
_PROFILE = raw_key("HPCPAR_PROFILE")


def autotune_on() -> bool:
    """Whether ``HPCPAR_AUTOTUNE`` asks for online tuning (read on every call)."""
    return flag_of("HPCPAR_AUTOTUNE", getenv_fast("HPCPAR_AUTOTUNE", _KEY))


def measure_calls(state: Any, name: str, run: Any) -> float:
    """Seconds per call of ``run``, candidate ``name``, on the slowest rank (collective).

    The best of ``ROUNDS`` loops of calls, each about ``BUDGET_S / ROUNDS``, each started
    together (a barrier) and timed on its slowest rank: a loop that a busy machine slowed
    down does not decide, and ranks that run ahead of the others in a loop of calls (an
    algorithm that does not synchronise them all) do not hide the time the slowest took.
    """
    start = time.perf_counter()
    run()  # warm up, and a first estimate
    once = state.private.allreduce(time.perf_counter() - start, op=MPI.MAX)
    calls = max(1, min(10, int(BUDGET_S / ROUNDS / max(once, 1e-7))))
    best = float("inf")
    for _ in range(ROUNDS):
        state.private.Barrier()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        took = state.private.allreduce((time.perf_counter() - start) / calls, op=MPI.MAX)
        best = min(best, took)
    return best


def tuned_algorithm(
    x: Any, op: Any, comm: Any, call: Callable[[str, np.ndarray], Any]
) -> tuple[str, str]:
    """The algorithm ``auto`` keeps for an allreduce like this one, timing it if new.

    Args:
        x: The call's data.
        op: Its op.
        comm: Its communicator.
        call: ``call(algorithm, scratch)`` runs the allreduce of ``x`` with that
            algorithm into ``scratch`` (collective; timed for each candidate).

    Returns:
        (algorithm, reason); the reason lists the measured candidates.
    """
    state = fast_state(comm)
    opkey = op.py2f() if isinstance(op, MPI.Op) else id(op)
    quick = (x.nbytes.bit_length(), x.dtype.str, opkey, getenv_fast("", _PROFILE))
    if state is not None and quick in state.tuned_quick:
        return state.tuned_quick[quick]
    from ..runtime.profile import active_profile
    from .algorithms import ALGORITHMS
    from .cost.explain import plan_for
    from .ops import resolve_op
    from .select import valid_for
    from .state import state_for
    from .tally import Layout

    state = state_for(comm)
    rop = resolve_op(op, np.dtype(x.dtype))
    profile = active_profile()
    key = (
        "allreduce",
        int(x.nbytes).bit_length(),
        np.dtype(x.dtype).str,
        rop.commutative,
        profile.name if profile else None,
    )
    if key in state.tuned:
        state.tuned_quick[quick] = state.tuned[key]
        return state.tuned[key]
    plan = plan_for(
        "allreduce",
        int(x.nbytes),
        Layout(tuple(state.node_of)),
        profile,
        itemsize=x.itemsize,
        commutative=rop.commutative,
        calibrated_only=False,
    )
    table = ALGORITHMS["allreduce"]
    others = [
        p.algorithm
        for p in plan.ranking
        if p.algorithm != LIBRARY and valid_for(table[p.algorithm], rop, state) is None
    ]
    candidates = [LIBRARY, *others[:CANDIDATES]]
    scratch = x.copy()
    mine = [
        measure_calls(state, name, lambda name=name: call(name, scratch)) for name in candidates
    ]
    times = np.empty(len(mine))
    state.private.Allreduce(np.array(mine), times, op=MPI.MAX)
    best = int(np.argmin(times))
    measured = ", ".join(f"{n} {t * 1e6:.1f} us" for n, t in zip(candidates, times, strict=True))
    state.tuned[key] = (candidates[best], f"auto: autotuned on first use ({measured})")
    if not isinstance(op, MPI.Op):  # an object's id can be reused once it is gone
        return state.tuned[key]
    state.tuned_quick[quick] = state.tuned[key]
    return state.tuned[key]


def tuned(comm: Any = None) -> dict[tuple[Any, ...], tuple[str, str]]:
    """What autotuning kept on ``comm`` so far: key -> (algorithm, reason)."""
    from .state import state_for

    return dict(state_for(comm).tuned)
