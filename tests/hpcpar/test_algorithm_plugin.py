"""Adding an algorithm is one new module: registered, it is run, counted, explained, simulated."""

from __future__ import annotations

import importlib.util
import textwrap

import numpy as np
import pytest
from collective_cases import contribution, fold
from mpi4py import MPI

import hpcpar
from hpcpar.collectives import algorithms_for, last_stats
from hpcpar.collectives.cost.counts import counts_for
from hpcpar.collectives.cost.simulate import labels, simulate
from hpcpar.collectives.registry import TABLE, register
from hpcpar.collectives.tally import Layout
from hpcpar.runtime.profile import default_profile
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi

TOY = '''
"""A toy allreduce: a binomial reduce to rank 0, then a binomial bcast from it."""

from hpcpar.collectives.algorithms import binomial
from hpcpar.collectives.registry import Algorithm


def allreduce(call, buf, op):
    yield from binomial.reduce(call.flat, buf, op, 0)
    yield from binomial.bcast(call.flat, buf, 0)


def counts(c, g, rank, s):
    binomial.count_reduce(c, g.flat, rank, s.nbytes, 0)
    binomial.count_bcast(c, g.flat, rank, s.nbytes, 0)


ALGORITHMS = (
    Algorithm(
        name="reduce_bcast",
        collective="allreduce",
        run=allreduce,
        label="TY",
        counts=counts,
        classic=True,
    ),
)
'''


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy_reduce_bcast.py"
    path.write_text(textwrap.dedent(TOY))
    spec = importlib.util.spec_from_file_location("toy_reduce_bcast", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = dict(TABLE["allreduce"])
    register(*module.ALGORITHMS)  # the one line
    yield "reduce_bcast"
    TABLE["allreduce"].clear()
    TABLE["allreduce"].update(before)


def test_a_registered_algorithm_runs_and_is_counted_exactly(comm, toy):
    rank, size = comm.Get_rank(), comm.Get_size()
    h = hpcpar.Hierarchy(comm, layout="ppn:2")
    assert toy in algorithms_for("allreduce")
    x = contribution(rank, 1000, "f8")
    got = hpcpar.allreduce(x, comm=h, algorithm=toy)
    want = fold(MPI.SUM, [contribution(r, 1000, "f8") for r in range(size)])
    stats = last_stats()
    seen = (
        stats.messages_intra,
        stats.bytes_intra,
        stats.messages_inter,
        stats.bytes_inter,
        stats.reduced_bytes,
    )
    formula = counts_for("allreduce", toy, Layout(tuple(h.node_of)), rank, 1000, 8).as_tuple()
    assert_all(np.array_equal(got, want), "toy allreduce result", comm)
    assert_all(stats.algorithm == toy and seen == formula, f"{seen} != {formula}", comm)
    h.free()


def test_a_registered_algorithm_is_explained_and_simulated(comm, toy):
    plan = hpcpar.explain("allreduce", 1 << 10, comm=comm)
    assert toy in [p.algorithm for p in plan.ranking]
    assert toy in str(plan)
    rows = simulate("allreduce", [2, 8], 4, [8, 1 << 20], default_profile())
    assert {r.algorithm for r in rows if r.algorithm == toy} == {toy}
    assert labels("allreduce")[toy] == "TY"
