"""Whole jobs of an unchanged mpi4py program under ``hpcpar launch --intercept``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launching import clean_env, hpcpar

pytestmark = pytest.mark.slow

PROGRAM = str(Path(__file__).parents[1] / "helpers" / "intercepted_program.py")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [1, 3])
def test_an_unchanged_program_runs_through_hpcpar(ranks, tmp_path):
    report = tmp_path / "report"
    job = hpcpar(
        "launch",
        "-n",
        str(ranks),
        "--layout",
        "ppn:2",
        "--intercept",
        "--",
        PROGRAM,
        env=clean_env(HPCPAR_INTERCEPT_REPORT=str(report)),
        timeout=240,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    assert sorted(job.stdout.split()) == sorted(
        f"{w}" for r in range(ranks) for w in ("ok", str(r))
    )
    for rank in range(ranks):
        calls = json.loads((report / f"intercept{rank}.json").read_text())["calls"]
        carried = {c["call"]: c["count"] for c in calls if c["route"] == "hpcpar"}
        assert carried.get("Allreduce") == 3 and carried.get("Bcast") == 1, calls
        assert carried.get("Iallreduce") == 1, calls


@pytest.mark.timeout(300)
def test_the_module_form_and_its_usage_errors():
    job = hpcpar(
        "launch",
        "-n",
        "2",
        "--intercept",
        "--explain-calls",
        "--",
        "python",
        "-m",
        "hpcpar.intercept",
        "--help",
        env=clean_env(),
        timeout=120,
    )
    assert job.returncode == 0 and "usage: python -m hpcpar.intercept" in job.stdout
    job = hpcpar("launch", "-n", "2", "--intercept", "--", "demo", env=clean_env(), timeout=60)
    assert job.returncode == 2 and "--intercept runs a Python program" in job.stderr
    job = hpcpar("launch", "-n", "2", "--explain-calls", "--", PROGRAM, env=clean_env(), timeout=60)
    assert job.returncode == 2 and "needs --intercept" in job.stderr
    job = hpcpar(
        "launch",
        "-n",
        "2",
        "--intercept",
        "--",
        PROGRAM,
        env=clean_env(HPCPAR_INTERCEPT_SKIP="Allreduce,Nonsense"),
        timeout=120,
    )
    assert job.returncode == 2, job.stdout + job.stderr
    assert "HPCPAR_INTERCEPT_SKIP: unknown collective 'Nonsense'" in job.stderr
    assert "Traceback" not in job.stderr


@pytest.mark.timeout(300)
def test_ranks_that_disagree_get_the_guards_error_not_a_hang():
    job = hpcpar(
        "launch",
        "-n",
        "2",
        "--intercept",
        "--watchdog",
        "20",
        "--",
        PROGRAM,
        "mismatch",
        env=clean_env(),
        timeout=240,
    )
    text = job.stdout + job.stderr
    assert job.returncode != 0, text
    assert "CollectiveMismatchError" in text, text
    assert "Traceback" not in text
