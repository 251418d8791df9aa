"""CFR at 1-4 ranks under virtual layouts gives the single-process results, bit for bit."""

from __future__ import annotations

import pytest
from hpcpar.apps.cfr import Solver, build_tree

import hpcpar
from hpcpar.testing import assert_all, layouts_for

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("algorithm", ["cfr", "cfr+", "dcfr", "pcfr+"])
@pytest.mark.parametrize("layout", layouts_for(hpcpar.default_comm().Get_size())[:4])
def test_same_results_at_any_rank_count(comm, algorithm, layout):
    tree = build_tree("leduc_poker")
    alone = Solver(tree, algorithm)
    alone.iterate(6)
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        together = Solver(tree, algorithm, comm=h)
        together.iterate(6)
        gap, expect = together.nash_conv(), alone.nash_conv()
        assert_all(abs(gap - expect) < 1e-12, f"NashConv {gap} vs {expect}", comm)
        mine, ref = together.average_policy(), alone.average_policy()
        worst = max(
            abs(mine[p][k][a] - ref[p][k][a]) for p in (0, 1) for k in ref[p] for a in ref[p][k]
        )
        assert_all(worst == 0, f"average policies differ by {worst}", comm)
        owned = comm.allreduce(together.parts[0].L)
        assert_all(owned == tree.players[0].n_seq - 1, "every sequence owned once", comm)


def tree_order(solver, arrays):
    """``arrays`` (one per player, this rank's part in local order) over the whole tree,
    in its sequence order, on every rank (the parts are disjoint: summing is exact)."""
    import numpy as np

    out = []
    for p, part in enumerate(solver.parts):
        full = np.zeros(solver.tree.players[p].n_seq)
        full[part.old_seqs] = np.asarray(arrays[p])
        if solver.comm is not None:
            full = solver.comm.allreduce(full)
        out.append(full)
    return out


@pytest.mark.reliability("fault")
@pytest.mark.parametrize("algorithm", ["cfr", "pcfr+"])
def test_saved_on_n_ranks_resumes_on_every_rank_count_with_identical_regrets(
    comm, tmp_path, algorithm
):
    """The canonical sequence order makes every sum the same at any rank count, and the
    checkpoint's Sharded blocks of it restore on any rank count: a run saved at N ranks
    and resumed at each N' in 1..4 has bitwise the regrets and strategy sums of an
    uninterrupted single-process run."""
    import numpy as np
    from hpcpar.checkpoint import Checkpointer
    from states import shared_dir

    tree = build_tree("leduc_poker")
    alone = Solver(tree, algorithm)
    alone.iterate(8)
    expect = [tree_order(alone, a) for a in (alone.regret, alone.strategy_sum, alone.sigma)]
    root = shared_dir(comm, tmp_path) / "ck"
    size = comm.Get_size()
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        first = Solver(tree, algorithm, comm=h)
        first.iterate(4)
        with Checkpointer(root, comm=h, levels=["local"]) as ck:
            ck.save(4, first.state()).wait()
    for n in range(1, size + 1):
        sub = comm.Split(0 if comm.Get_rank() < n else 1, comm.Get_rank())
        try:
            if comm.Get_rank() < n:
                with hpcpar.Hierarchy(sub, layout="ppn:1") as h:
                    again = Solver(tree, algorithm, comm=h)
                    with Checkpointer(root, comm=h, levels=["local"]) as ck:
                        step, state = ck.restore(reshard=again.blocks())
                    again.load_state(state)
                    assert step == 4 and again.t == 4
                    again.iterate(4)
                    got = [
                        tree_order(again, a)
                        for a in (again.regret, again.strategy_sum, again.sigma)
                    ]
                    for name, g, e in zip(
                        ("regret", "strategy_sum", "sigma"), got, expect, strict=True
                    ):
                        for p in (0, 1):
                            assert np.array_equal(g[p], e[p]), (n, name, p)
        finally:
            sub.Free()
            comm.Barrier()
