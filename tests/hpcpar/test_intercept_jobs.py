"""Whole jobs of an unchanged mpi4py program under ``hpcpar launch --intercept``."""

from __future__ import annotations

import json
import re
from collections import Counter
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
    assert sorted(int(r) for r in re.findall(r"ok (\d+)", job.stdout)) == list(range(ranks))
    for rank in range(ranks):
        calls = json.loads((report / f"intercept{rank}.json").read_text())["calls"]
        carried: Counter[str] = Counter()
        for c in calls:
            if c["route"] == "hpcpar":
                carried[c["call"]] += c["count"]
        assert carried.get("Allreduce") == 3 and carried.get("Bcast") == 1, calls
        assert carried.get("Iallreduce") == 1, calls


def _job(*arguments: str, timeout: int = 120, **env: str):
    return hpcpar("launch", "-n", "2", *arguments, env=clean_env(**env), timeout=timeout)


@pytest.mark.timeout(300)
def test_the_module_form_and_its_usage_errors():
    job = _job("--", "python", "-m", "hpcpar.intercept", "--help")
    assert job.returncode == 0 and "usage: python -m hpcpar.intercept" in job.stdout
    job = _job("--intercept", "--", "demo")
    assert job.returncode == 2 and "--intercept runs a Python program" in job.stderr
    job = _job("--explain-calls", "--", PROGRAM)
    assert job.returncode == 2 and "needs --intercept" in job.stderr
    job = _job("--intercept", "--", PROGRAM, HPCPAR_INTERCEPT_SKIP="Allreduce,Nonsense")
    assert job.returncode == 2, job.stdout + job.stderr
    assert "HPCPAR_INTERCEPT_SKIP: unknown collective 'Nonsense'" in job.stderr
    assert "Traceback" not in job.stderr


@pytest.mark.timeout(300)
def test_ranks_that_disagree_get_the_guards_error_not_a_hang():
    job = _job("--intercept", "--watchdog", "20", "--", PROGRAM, "mismatch", timeout=240)
    text = job.stdout + job.stderr
    assert job.returncode != 0, text
    assert "CollectiveMismatchError" in text, text
    assert "Traceback" not in text


@pytest.mark.timeout(300)
def test_threads_on_their_own_communicators():
    job = _job("--intercept", "--", PROGRAM, "threads", timeout=240)
    assert job.returncode == 0, job.stdout + job.stderr
    assert sorted(int(r) for r in re.findall(r"ok (\d+)", job.stdout)) == [0, 1]
