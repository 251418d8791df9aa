"""auto under a rules file and under a profile, on every rank alike."""

from __future__ import annotations

import json

import numpy as np
import pytest
from collective_cases import affine, contribution

import hpcpar
from hpcpar.collectives import last_stats
from hpcpar.collectives.cost.profile import ProfileError
from hpcpar.collectives.cost.rules import RulesError
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
