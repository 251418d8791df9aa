"""Graph500 Kronecker generator: the specification's statistics, the same list at any P."""

from __future__ import annotations

import numpy as np
import pytest
from hpcpar.apps.graph import GraphError, feistel_permute, kronecker
from hpcpar.apps.graph.kronecker import raw_kronecker_edges

from hpcpar.testing import assert_all


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 4096, 65537])
def test_feistel_is_a_bijection(n):
    out = feistel_permute(np.arange(n), n, seed=5, stream=2)
    assert np.array_equal(np.sort(out), np.arange(n))
    if n > 100:  # and it moves things: far from the identity
        assert np.mean(out == np.arange(n)) < 0.05


def test_quadrant_probabilities_are_the_specifications():
    scale, m = 4, 200_000
    src, dst = raw_kronecker_edges(scale, 3, np.arange(m))
    ii = (src[:, None] >> np.arange(scale)) & 1
    jj = (dst[:, None] >> np.arange(scale)) & 1
    quadrant = {
        q: float(np.mean((ii == q[0]) & (jj == q[1]))) for q in [(0, 0), (0, 1), (1, 0), (1, 1)]
    }
    expect = {(0, 0): 0.57, (0, 1): 0.19, (1, 0): 0.19, (1, 1): 0.05}
    for q, p in expect.items():  # 800,000 draws: 4 standard errors is under 0.003
        assert quadrant[q] == pytest.approx(p, abs=0.003), q


def test_sizes_weights_and_the_skewed_degrees():
    g = kronecker(10, 16, seed=2)
    assert g.n_vertices == 1024 and g.n_edges == g.src.size == 16 * 1024
    assert g.src.min() >= 0 and max(g.src.max(), g.dst.max()) < 1024
    assert g.weight.min() >= 0 and g.weight.max() < 1
    degree = np.bincount(np.concatenate([g.src, g.dst]), minlength=1024)
    assert degree.max() > 20 * np.median(degree)  # power-law-like: hubs
    assert np.any(g.src == g.dst)  # self-loops are kept
    with pytest.raises(GraphError, match="SCALE"):
        kronecker(0)
    with pytest.raises(GraphError, match="part 3 of 2"):
        kronecker(5, part=3, parts=2)


@pytest.mark.mpi
def test_every_rank_count_gives_the_same_list(comm):
    whole = kronecker(9, 8, seed=11)
    part = kronecker(9, 8, seed=11, part=comm.Get_rank(), parts=comm.Get_size())
    got = [
        np.concatenate(x)
        for x in zip(*comm.allgather((part.src, part.dst, part.weight)), strict=True)
    ]
    same = all(
        np.array_equal(a, b) for a, b in zip(got, (whole.src, whole.dst, whole.weight), strict=True)
    )
    assert_all(same, "the slices do not concatenate to the 1-rank list", comm)
