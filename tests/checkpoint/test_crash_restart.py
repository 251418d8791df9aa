"""Kill a rank at each phase of the save protocol; the restarted job resumes and agrees.

Every case runs a real job (tests/helpers/ckpt_job.py) with HPCPAR_CHECKPOINT_FAULT set
to SIGKILL one rank during the save of step 3, checks that the job died, restarts it
without the fault, and asserts the version it resumed from, the level that served each
rank, and that its final state equals an uninterrupted run bit for bit (and the same
computation done in numpy, to rounding).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from launching import clean_env, launch

pytestmark = [pytest.mark.slow, pytest.mark.reliability("fault")]  # starts whole jobs
STEPS = 6
JOB = str(Path(__file__).parents[1] / "helpers" / "ckpt_job.py")
sys.path.insert(0, str(Path(JOB).parent))
from ckpt_job import initial  # noqa: E402


def reference(size: int) -> np.ndarray:
    x = np.stack([initial(r) for r in range(size)])
    for _ in range(STEPS):
        x = 0.5 * x + np.sin(x).sum(axis=0) / size
    return x


# phase -> the version a restart must resume from (the kill hits the save of step 3).
# before-commit kills rank 0, which writes commit markers: once every rank has reported
# its shard durable, another rank dying cannot stop rank 0 committing a whole version.
RESUME = {"snapshot": 2, "write": 2, "before-commit": 2, "after-commit": 3}
VICTIM = {"snapshot": 1, "write": 1, "before-commit": 0, "after-commit": 1}
# (ranks, layout, levels, node lost after the crash, level the kill phase refers to)
CONFIGS = [
    (3, "nodes:2,1", "memory,local,partner", None, "local"),
    (4, "ppn:2", "memory,local,xor,hdf5", None, "local"),
    (2, "ppn:1", "memory,local,partner", 0, "partner"),
]
_uninterrupted: dict[tuple, np.ndarray] = {}


def uninterrupted(tmp_path, ranks, layout, levels) -> np.ndarray:
    """The job run start to end without a fault (once per configuration)."""
    key = (ranks, layout, levels)
    if key not in _uninterrupted:
        out = tmp_path / "plain.npy"
        args = (JOB, str(tmp_path / "plain"), str(STEPS), levels, layout, str(out))
        done = launch(ranks, sys.executable, *args)
        assert done.returncode == 0, done.stdout + done.stderr
        _uninterrupted[key] = np.load(out)
    return _uninterrupted[key]


@pytest.mark.parametrize("phase", list(RESUME))
@pytest.mark.parametrize(("ranks", "layout", "levels", "lose", "level"), CONFIGS)
def test_killed_job_resumes_and_matches(tmp_path, phase, ranks, layout, levels, lose, level):
    root, out = tmp_path / "ck", tmp_path / "x.npy"
    args = (JOB, str(root), str(STEPS), levels, layout, str(out))
    env = clean_env(
        HPCPAR_CHECKPOINT_FAULT=f"kill={phase},step=3,rank={VICTIM[phase]},level={level}"
    )
    crashed = launch(ranks, sys.executable, *args, env=env)
    assert crashed.returncode != 0 and not out.exists(), crashed.stdout + crashed.stderr
    if lose is not None:
        from hpcpar.checkpoint import faults

        faults.delete_node(root, lose)
    again = launch(ranks, sys.executable, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = [line.split() for line in again.stdout.splitlines() if line.startswith("resumed")]
    assert resumed, again.stdout
    step, served = int(resumed[0][1]), resumed[0][2].split(",")
    assert step == RESUME[phase]
    if lose is None:
        assert served == ["local"] * ranks
    else:
        assert served == ["partner" if r == lose else "local" for r in range(ranks)]
    final = np.load(out)
    np.testing.assert_array_equal(final, uninterrupted(tmp_path, ranks, layout, levels))
    np.testing.assert_allclose(final, reference(ranks), rtol=1e-12, atol=1e-14)


EXIT_JOB = """
import sys, numpy as np, hpcpar
from hpcpar.checkpoint import Checkpointer
comm = hpcpar.default_comm()
ck = Checkpointer(sys.argv[1], comm=hpcpar.Hierarchy(comm, layout="ppn:1"),
                  levels=["local", "partner"])
ck.save(7, {"x": np.full(1 << 20, comm.Get_rank(), dtype=np.int32)})
# no wait(), no close(): the interpreter's exit must finish the flush in flight
"""


def test_exit_without_close_finishes_the_flush(tmp_path):
    from hpcpar.checkpoint.inspect import verify

    root = tmp_path / "ck"
    done = launch(2, sys.executable, "-c", EXIT_JOB, str(root))
    assert done.returncode == 0, done.stdout + done.stderr
    results = verify(root)
    assert {(level, step) for level, step, *_ in results} == {("local", 7), ("partner", 7)}
    assert all(not problem for *_, problem in results), results
