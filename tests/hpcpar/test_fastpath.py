"""The allreduce fast path (``collectives/fastpath.py``) does by hand what the general
path's ``_begin`` does: a call through either leaves the same state behind. If one of
the two changes alone, this test fails."""

from __future__ import annotations

import numpy as np
import pytest

import hpcpar
from hpcpar.testing import assert_all

CALLS = [  # runs of identical calls, a new size, a new dtype, in-place
    ("x", np.ones(3)),
    ("x", np.ones(3)),
    ("x", np.ones(3)),
    ("x", np.arange(5.0)),
    ("x", np.ones(3)),
    ("x", np.ones(3, np.float32)),
    ("inplace", np.ones(4)),
    *[("x", np.ones(2)) for _ in range(6)],
]


def _run(comm) -> list:
    results = []
    for how, x in CALLS:
        a = x.copy()
        out = a if how == "inplace" else None
        results.append(hpcpar.allreduce(a, out=out, comm=comm, algorithm="mpi"))
    return results


def _per_call(label: str) -> list[tuple]:
    """The flight record's view of a communicator: one tuple a call, runs expanded."""
    from hpcpar.runtime import flight

    calls = []
    for record in flight.snapshot():
        if record["comm"] != label:
            continue
        what = (
            record["operation"],
            record["algorithm"],
            record["count"],
            record["dtype"],
            record["op"],
        )
        for seq in range(record["seq"], record["seq"] + (record["calls"] or 1)):
            calls.append((seq, *what))
    return calls


@pytest.mark.mpi
def test_the_fast_path_leaves_the_state_the_general_path_leaves(comm, monkeypatch):
    import hpcpar.collectives.api as api
    from hpcpar.collectives.state import state_for

    fast, general = comm.Dup(), comm.Dup()
    try:
        taken = []
        real = api.fast_allreduce
        monkeypatch.setattr(api, "fast_allreduce", lambda *a: taken.append(1) or real(*a))
        got_fast = _run(fast)
        monkeypatch.setattr(api, "fast_allreduce", lambda *a: None)
        got_general = _run(general)
        a, b = state_for(fast), state_for(general)
        a.fold_guard_run()
        b.fold_guard_run()
        same = [
            len(taken) == len(CALLS),  # the first run really went through the fast path
            all(np.array_equal(x, y) for x, y in zip(got_fast, got_general, strict=True)),
            a._sequence == b._sequence == len(CALLS),
            (a.guard_sum, a.guard_from, a.guard_next) == (b.guard_sum, b.guard_from, b.guard_next),
            [c[1:] for c in _per_call(a.label)] == [c[1:] for c in _per_call(b.label)],
            [c[0] for c in _per_call(a.label)] == list(range(len(CALLS))),
        ]
        assert_all(all(same), f"the two paths differ: {same}", comm)
    finally:
        fast.Free()
        general.Free()
