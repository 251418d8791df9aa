"""auto under a rules file and under a profile, on every rank alike."""

from __future__ import annotations

import json

import numpy as np
import pytest
from collective_cases import affine, contribution

import hpcpar
from hpcpar.collectives import last_stats
from hpcpar.collectives.cost.rules import RulesError
from hpcpar.runtime.profile import ProfileError
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi


def shared_path(comm, tmp_path, name, doc):
    path = comm.bcast(str(tmp_path / name), root=0)
    if comm.Get_rank() == 0:
        with open(path, "w") as handle:
            json.dump(doc, handle)
    comm.Barrier()
    return path


def test_rules_drive_auto(comm, tmp_path, monkeypatch):
    rules = {
        "format": "hpcpar-rules",
        "version": 1,
        "allreduce": [
            {"max_bytes": 1024, "algorithm": "recursive_doubling"},
            {"algorithm": "ring"},
        ],
    }
    monkeypatch.setenv("HPCPAR_RULES", shared_path(comm, tmp_path, "rules.json", rules))
    rank, size = comm.Get_rank(), comm.Get_size()
    ran = []
    for n in (4, 1000):
        got = hpcpar.allreduce(contribution(rank, n, "f8"))
        assert_all(
            np.array_equal(got, sum(contribution(r, n, "f8") for r in range(size))),
            "rules result",
            comm,
        )
        ran.append(last_stats().algorithm)
    assert_all(ran == ["recursive_doubling", "ring"], f"rules not followed: {ran}", comm)
    # a rule never forces a wrong result: ring cannot reduce a non-commutative op
    hpcpar.allreduce(contribution(rank, 200, [("m", "f8"), ("c", "f8")]), affine)
    assert_all(
        last_stats().algorithm == "mpi", f"non-commutative op got {last_stats().algorithm}", comm
    )


def test_bad_rules_and_profiles_fail_on_every_rank(comm, tmp_path, monkeypatch):
    monkeypatch.setenv(
        "HPCPAR_RULES", shared_path(comm, tmp_path, "bad.json", {"format": "hpcpar-rules"})
    )
    with pytest.raises(RulesError, match="unsupported rules version"):
        hpcpar.allreduce(np.ones(3))
    monkeypatch.delenv("HPCPAR_RULES")
    monkeypatch.setenv("HPCPAR_PROFILE", shared_path(comm, tmp_path, "p.json", {"format": "nope"}))
    with pytest.raises(ProfileError, match="not an hpcpar profile"):
        hpcpar.allreduce(np.ones(3))


def test_autotune_keeps_the_candidate_fastest_on_the_slowest_rank(comm, monkeypatch):
    from hpcpar.collectives import autotune

    rank, size = comm.Get_rank(), comm.Get_size()
    seen = []

    def fake(state, name, run):  # the library fastest on every rank but the last
        run()  # still collective, as the real measurement
        seen.append(name)
        i = len(seen) - 1
        return [1.0, 4.0, 6.0, 6.0][i] + (9.0 if i == 0 and rank == size - 1 else 0.0)

    monkeypatch.setattr(autotune, "measure_calls", fake)
    fresh = comm.Dup()  # its own state: nothing tuned on it yet
    x = contribution(rank, 1000, np.float64)
    keep = x.copy()
    want = sum(contribution(q, 1000, np.float64) for q in range(size))
    got = hpcpar.allreduce(x, comm=fresh, autotune=True)
    assert_all(np.allclose(got, want) and np.array_equal(x, keep), "result, input kept", comm)
    assert_all(seen[0] == "mpi" and len(seen) == len(set(seen)) >= 2, f"candidates {seen}", comm)
    assert_all(last_stats().algorithm == seen[1], f"kept {last_stats().algorithm}", comm)
    assert_all(comm.allgather(seen) == [seen] * size, "same candidates everywhere", comm)
    again = hpcpar.allreduce(x + 1, comm=fresh, autotune=True)  # same size class
    assert_all(len(seen) <= 4 and np.allclose(again, want + size), "tuned once", comm)
    ((_, (name, reason)),) = autotune.tuned(fresh).items()
    assert_all(name == seen[1] and "autotuned on first use" in reason, reason, comm)
    fresh.Free()


def test_autotune_from_the_environment_measures_for_real(comm, monkeypatch):
    import re

    from hpcpar.collectives import autotune

    monkeypatch.setenv("HPCPAR_AUTOTUNE", "1")
    x = np.full(4096, float(comm.Get_rank()))
    got = hpcpar.allreduce(x)
    assert_all(np.array_equal(got, np.full(4096, sum(range(comm.Get_size())))), "sum", comm)
    tuned = [v for k, v in autotune.tuned().items() if k[1] == x.nbytes.bit_length()]
    assert_all(len(tuned) == 1, f"one entry for the size class: {tuned}", comm)
    name, reason = tuned[0]
    times = {n: float(t) for n, t in re.findall(r"(\w+) ([0-9.]+) us", reason)}
    assert_all(name == min(times, key=times.get) and "mpi" in times, reason, comm)
    assert_all(comm.allgather(name) == [name] * comm.Get_size(), "one winner", comm)
