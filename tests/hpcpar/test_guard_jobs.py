"""The mismatch guard against calls that change what MPI moves: whole jobs.

A changed count or root can make the MPI library fail, hang or deliver a short message,
so each trial is a job of its own (``helpers/perturbed_job.py``): random allreduces and
broadcasts, one rank changing one call's count or root at a random position. In-process
trials of the changes MPI cannot see (swaps, dtypes, ops) are in
``test_collectives_errors.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from launching import clean_env, hpcpar
from perturbed_job import CALLS

pytestmark = pytest.mark.slow

JOB = str(Path(__file__).parents[1] / "helpers" / "perturbed_job.py")
WATCHDOG = "4"  # seconds: a changed root can leave ranks waiting for each other


def _trial(ranks, seed, kind, at, victim, algorithm, **env):
    options = ["-n", str(ranks), "--timeout", "60", "--watchdog", WATCHDOG]
    command = [sys.executable, JOB, str(seed), kind, str(at), str(victim), algorithm]
    job = hpcpar("launch", *options, "--", *command, env=clean_env(**env), timeout=90)
    text = job.stdout + job.stderr
    wrong = [int(i) for i in re.findall(r"WRONG #(\d+)", text)]
    finished = len(re.findall(r"done on rank", text))
    return job.returncode, text, wrong, finished


@pytest.mark.reliability("bad_input")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_changed_count_or_root_never_passes(ranks, record_property):
    """Each trial: the job fails (status 1 with CollectiveMismatchError, or the
    watchdog's status 4 naming the call), before its calls run 256 past the change or
    as it ends; a wrong result, if any, only from the changed call itself (a rank that
    receives less than it expected is not told by MPI). With ``HPCPAR_CHECK=1``, no
    wrong result at all."""
    rng = np.random.default_rng()
    trials = 0
    plans = [(kind, {}) for kind in ("count-up", "count-down", "root")]
    plans.append((("count-up", "count-down", "root")[int(rng.integers(3))], {"HPCPAR_CHECK": "1"}))
    for kind, env in plans:
        seed, at, victim = (
            int(rng.integers(1 << 30)),
            int(rng.integers(CALLS)),
            int(rng.integers(ranks)),
        )
        algorithm = ("mpi", "auto")[int(rng.integers(2))]
        status, text, wrong, finished = _trial(ranks, seed, kind, at, victim, algorithm, **env)
        where = f"{kind} at #{at} on rank {victim} of {ranks} ({algorithm}, seed {seed}, {env})"
        assert status in (1, 4), f"status {status}: {where}\n{text[-3000:]}"
        if status == 1:
            assert "CollectiveMismatchError" in text, f"{where}\n{text[-3000:]}"
        else:
            assert re.search(rf"hpcpar watchdog: \w+ #{at} on world", text), f"{where}\n{text}"
        if at + 256 < CALLS:
            assert finished == 0, f"{finished} rank(s) finished: {where}\n{text[-3000:]}"
        allowed = set() if env else {at}
        assert set(wrong) <= allowed, f"wrong results {wrong}: {where}\n{text[-3000:]}"
        trials += 1
    record_property("reliability_cases", trials)


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    "case, expect",
    [
        # after the last comparison (#256), the library's call sees nothing: the
        # comparison as the job ends reports it
        ((3, 16333, "count-up", 263, 2, "auto"), r"the end of the job: ranks differ at #263"),
        # a broadcast whose sizes MPICH finds to differ ("message sizes do not match")
        ((3, 14025, "count-up", 82, 2, "mpi"), r"bcast: a message from another rank was of"),
    ],
)
def test_known_changed_counts_are_named(case, expect):
    ranks, seed, kind, at, victim, algorithm = case
    status, text, wrong, _ = _trial(ranks, seed, kind, at, victim, algorithm)
    assert status == 1, text
    assert re.search(expect, text), text
    assert set(wrong) <= {at}, text
