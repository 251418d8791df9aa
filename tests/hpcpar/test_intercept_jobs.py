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
    report, trace = tmp_path / "report", tmp_path / "trace"
    job = hpcpar(
        "launch",
        "-n",
        str(ranks),
        "--layout",
        "ppn:2",
        "--intercept",
        "--",
        PROGRAM,
        env=clean_env(HPCPAR_INTERCEPT_REPORT=str(report), HPCPAR_TRACE=str(trace)),
        timeout=240,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    # the timeline names the program's calls and lines
    timeline = hpcpar("trace", str(trace), timeout=120).stdout
    source = Path(PROGRAM).read_text().splitlines()
    line = next(i for i, t in enumerate(source, 1) if "comm.Allreduce(x, y, op=MPI.SUM)" in t)
    assert "Allreduce (mpi, count 6, float64)" in timeline, timeline
    assert f"intercepted_program.py:{line} in <module>" in timeline, timeline
    assert "Iallreduce" in timeline and "Bcast" in timeline, timeline
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
    # the same bytes, other dtypes: the library sees nothing; the guard, on every rank
    job = _job("--intercept", "--watchdog", "20", "--", PROGRAM, "mismatch", timeout=240)
    text = job.stdout + job.stderr
    assert job.returncode == 2, text
    line = re.compile(
        r"^\[(\d)/2\] hpcpar: error: allreduce: ranks differ at #\d+ on MPI_COMM_WORLD: "
        r"rank\(s\) 0 called Allreduce \(mpi, count 2, float32, op SUM\); "
        r"rank\(s\) 1 called Allreduce \(mpi, count 1, float64, op SUM\).*"
        r"\(called at .*intercepted_program\.py:\d+\)$",
        re.M,
    )
    assert sorted(line.findall(job.stderr)) == ["0", "1"], text
    assert "Traceback" not in text
    # fewer elements on one rank: the library ends the job; the launcher says why
    job = _job("--intercept", "--watchdog", "20", "--", PROGRAM, "truncate", timeout=240)
    text = job.stdout + job.stderr
    assert job.returncode != 0 and "CollectiveMismatchError" in text, text
    assert "Traceback" not in text


@pytest.mark.timeout(300)
def test_the_watchdog_names_the_programs_call_and_line():
    job = _job("--intercept", "--watchdog", "3", "--", PROGRAM, "hang", timeout=240)
    text = job.stdout + job.stderr
    assert job.returncode == 4, text
    source = Path(PROGRAM).read_text().splitlines()
    line = next(i for i, t in enumerate(source, 1) if "the line the watchdog names" in t)
    assert re.search(r"hpcpar watchdog: Allgather #\d+ on MPI_COMM_WORLD", text), text
    assert f"called at {PROGRAM}:{line} in <module>" in text, text


@pytest.mark.timeout(300)
def test_threads_on_their_own_communicators():
    job = _job("--intercept", "--", PROGRAM, "threads", timeout=240)
    assert job.returncode == 0, job.stdout + job.stderr
    assert sorted(int(r) for r in re.findall(r"ok (\d+)", job.stdout)) == [0, 1]


@pytest.mark.timeout(600)
def test_mpi4py_own_collective_tests_pass_the_same_under_interception(tmp_path):
    """Two of mpi4py's own collective test modules, from the source distribution of the
    installed version, at 2 ranks as they are and intercepted: the same tests pass, and
    hpcpar ran calls (the whole set at 1-4 ranks: BENCHMARKS.md, docs/intercept.md)."""
    import subprocess
    import sys
    import tarfile

    import mpi4py

    version = mpi4py.__version__
    fetched = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", f"mpi4py=={version}"),
            *("--no-binary", "mpi4py", "--no-deps", "--quiet", "-d", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert fetched.returncode == 0, fetched.stderr
    with tarfile.open(tmp_path / f"mpi4py-{version}.tar.gz") as sdist:
        sdist.extractall(tmp_path, filter="data")
    check = Path(__file__).parents[2] / "jobs" / "intercept" / "mpi4py_tests.py"
    job = subprocess.run(
        [
            *(sys.executable, str(check), str(tmp_path / f"mpi4py-{version}" / "test")),
            *("--ranks", "2", "--modules", "test_cco_nb_vec,test_cco_pr_buf"),
        ],
        capture_output=True,
        text=True,
        timeout=500,
        env=clean_env(),
        check=False,
    )
    assert job.returncode == 0, job.stdout + job.stderr[-3000:]
    # the check compares the two runs' counts itself; here: both passed, and the same
    cells = [c.strip() for c in job.stdout.strip().splitlines()[-1].split("|")]
    plain, intercepted = cells[2].rsplit(",", 1)[0], cells[3].rsplit(",", 1)[0]
    assert plain == intercepted and ", OK" in plain, cells
