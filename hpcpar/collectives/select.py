"""Choosing an algorithm: validate an explicit choice, or pick one for ``"auto"``.

``auto`` honours ``HPCPAR_ALGORITHM_<COLLECTIVE>`` (for example
``HPCPAR_ALGORITHM_ALLREDUCE=ring``); otherwise, with a calibrated profile in
``HPCPAR_PROFILE``, it runs the cost model's fastest algorithm for the call's size class
(cached per communicator), and without one the MPI library's own call. The choice is
always correct for the op (rank order kept for non-commutative ops).
"""

from __future__ import annotations

from ..runtime.env import getenv_fast
from ..runtime.settings import raw_key
from .algorithms import ALGORITHMS
from .errors import CollectiveError
from .ops import ReduceOp
from .registry import LIBRARY, ORDER_CONTIGUOUS, ORDER_NONE, Algorithm
from .state import CommState

__all__ = ["choose", "valid_for"]

_ENV_KEYS = {name: raw_key(f"HPCPAR_ALGORITHM_{name.upper()}") for name in ALGORITHMS}


def valid_for(algorithm: Algorithm, op: ReduceOp | None, state: CommState) -> str | None:
    """Why ``algorithm`` cannot reduce with ``op`` on this layout, or None if it can."""
    if op is None or op.commutative:
        return None
    if algorithm.order == ORDER_NONE:
        return f"it reorders operands, and op {op.name} is not commutative"
    if algorithm.order == ORDER_CONTIGUOUS and not state.contiguous:
        return (
            f"op {op.name} is not commutative and the nodes do not hold contiguous "
            "runs of ranks, so the node-by-node order is not rank order"
        )
    return None


def choose(
    collective: str,
    algorithm: str,
    op: ReduceOp | None,
    state: CommState,
    nbytes: int = 0,
    itemsize: int = 1,
) -> tuple[Algorithm, str]:
    """Return the algorithm to run and the reason it was chosen.

    Raises:
        CollectiveError: unknown algorithm (the message lists the valid ones), or one
            that would give a wrong result for a non-commutative op.
    """
    table = ALGORITHMS[collective]
    reason = f"algorithm={algorithm!r} was requested"
    if algorithm == "auto":
        env = getenv_fast("", _ENV_KEYS[collective])
        if env:
            algorithm, reason = env, f"HPCPAR_ALGORITHM_{collective.upper()}={env}"
        else:
            from .cost.explain import auto_choice

            commutative = op is None or op.commutative
            name, reason = auto_choice(collective, state, nbytes, itemsize, commutative)
            if valid_for(table[name], op, state):  # a rule cannot force a wrong result
                name, reason = (
                    LIBRARY,
                    f"auto: {name} cannot reduce op {op.name}, so the library's call",
                )
            return table[name], reason
    if algorithm not in table:
        names = ", ".join(["auto", *table])
        raise CollectiveError(
            f"{collective}: unknown algorithm {algorithm!r}; choose one of {names}"
        )
    chosen = table[algorithm]
    why_not = valid_for(chosen, op, state)
    if why_not:
        raise CollectiveError(f"{collective}: algorithm {algorithm!r} cannot be used: {why_not}")
    return chosen, reason
