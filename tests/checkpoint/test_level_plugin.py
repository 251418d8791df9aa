"""Adding a checkpoint level is one new module: registered, it is saved, restored, listed."""

from __future__ import annotations

import importlib.util
import textwrap

import numpy as np
import pytest
from hpcpar.checkpoint import LEVELS, Checkpointer, faults
from hpcpar.checkpoint.inspect import scan, verify
from hpcpar.checkpoint.levels import register
from states import same, shared_dir

from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi

TOY = '''
"""A toy level: every rank's shard in the shared root, under toy/."""

from hpcpar.checkpoint.levels.local import LocalLevel


class ToyLevel(LocalLevel):
    name = "toy"
    survives = "nothing more than the local level; it lives in the shared root"
    default_keep = 3
    node_local = False


LEVEL = ToyLevel
'''


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy_level.py"
    path.write_text(textwrap.dedent(TOY))
    spec = importlib.util.spec_from_file_location("toy_level", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = dict(LEVELS)
    register(module.LEVEL)  # the one line
    yield "toy"
    LEVELS.clear()
    LEVELS.update(before)


def test_a_registered_level_saves_restores_and_is_listed(comm, tmp_path, toy):
    rank = comm.Get_rank()
    root = shared_dir(comm, tmp_path) / "ck"
    with Checkpointer(root, comm=comm, levels=["memory", toy]) as ck:
        for step in range(1, 6):
            ck.save(step, {"w": np.full(3, float(step + rank)), "step": step}).wait()
        assert_all(ck.versions() == [5, 4, 3], f"default keep 3: {ck.versions()}", comm)
    with Checkpointer(root, comm=comm, levels=[toy]) as again:
        step, state = again.restore()
        want = {"w": np.full(3, float(5 + rank)), "step": 5}
        assert_all(step == 5 and same(state, want), "restore from the toy level", comm)
        assert_all(again.restored_from == [toy] * comm.Get_size(), "served by toy", comm)
    if rank == 0:
        info = scan(root)
        assert info["levels"][toy]["committed"] == [5, 4, 3]
        assert (root / "toy").is_dir()
        assert all(not problem for *_, problem in verify(root))
        assert faults.shard_path(root, toy, 5, 0).exists()
        assert faults.parse_fault("enospc=toy,step=2").enospc == toy
