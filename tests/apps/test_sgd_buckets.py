"""Bucket sizes from a backward pass's timeline (``plan_buckets``), against costs worked
out by hand."""

from __future__ import annotations

import pytest
from hpcpar.apps.sgd.torch import plan_buckets

MIB = 1 << 20
FOUR = [4 * MIB] * 4  # four gradients of 4 MiB, ready at a quarter, half, ... of a 1 s pass
READY = [0.25, 0.5, 0.75, 1.0]


def linear(alpha, per_byte=1e-9):
    return lambda n: alpha + n * per_byte


def test_cheap_calls_send_each_gradient_as_soon_as_it_is_ready():
    # per-gradient buckets: each is done long before the next is ready, so only the
    # last one's reduction is exposed; every limit up to 4 MiB cuts the same way
    limit, exposed, every = plan_buckets(FOUR, READY, 1.0, linear(0.01), overlap=True)
    assert limit == 4 * MIB
    assert exposed == pytest.approx(0.01 + 4 * MIB * 1e-9)
    assert every[8 * MIB] == pytest.approx(0.01 + 8 * MIB * 1e-9)  # the last two together
    assert every[1 << 28] == pytest.approx(0.01 + 16 * MIB * 1e-9)  # one bucket


def test_costly_calls_make_one_bucket():
    # a 1 s call: four buckets queue one after another from 0.25 s (3.25 s and all
    # the bytes past the end); one bucket costs a single call after the pass
    limit, exposed, every = plan_buckets(FOUR, READY, 1.0, linear(1.0), overlap=True)
    assert sum(FOUR) <= limit and exposed == pytest.approx(1.0 + 16 * MIB * 1e-9)
    assert every[4 * MIB] == pytest.approx(3.25 + 16 * MIB * 1e-9)


def test_without_overlap_every_bucket_waits_for_the_end_so_one_is_best():
    limit, exposed, every = plan_buckets(FOUR, READY, 1.0, linear(0.01), overlap=False)
    assert sum(FOUR) <= limit and exposed == pytest.approx(0.01 + 16 * MIB * 1e-9)
    assert every[4 * MIB] == pytest.approx(4 * 0.01 + 16 * MIB * 1e-9)


def test_buckets_never_mix_kinds():
    # two dtypes: at least two buckets whatever the limit, the second ready at the end
    limit, exposed, _ = plan_buckets(
        FOUR, READY, 1.0, linear(0.01), overlap=True, kinds=["f", "f", "d", "d"]
    )
    assert limit == 4 * MIB and exposed == pytest.approx(0.01 + 4 * MIB * 1e-9)
