"""CFR at 1-4 ranks under virtual layouts gives the single-process results."""

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
        assert_all(worst < 1e-12, f"average policies differ by {worst}", comm)
        owned = comm.allreduce(together.parts[0].L)
        assert_all(owned == tree.players[0].n_seq - 1, "every sequence owned once", comm)
