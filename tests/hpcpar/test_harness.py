"""The test harness itself: a test that starts a whole job is marked slow from its source,
and one that starts a job unmarked fails instead of slowing ``--quick`` down."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import whole_jobs

SAMPLE = textwrap.dedent("""
    import subprocess, sys
    from launching import hpcpar, launch

    def run(ranks):
        return hpcpar("launch", "-n", str(ranks), "--", "info")

    def test_through_a_helper_of_its_module():
        assert run(2).returncode == 0

    def test_through_the_launching_helper():
        launch(2, sys.executable, "job.py")

    def test_mpiexec_by_hand():
        subprocess.run(["mpiexec", "-n", "2", "hostname"])

    def test_a_dry_run_plans_only():
        from hpcpar.cli.main import main
        main(["launch", "--dry-run", "-n", "2", "--", "info"])

    def test_plain():
        assert 1 + 1 == 2
""")


def test_the_tests_that_start_a_whole_job_are_found_in_their_source(tmp_path):
    path = tmp_path / "test_sample.py"
    path.write_text(SAMPLE)
    found = whole_jobs.launching_functions(str(path))
    assert found == {
        "run",
        "test_through_a_helper_of_its_module",
        "test_through_the_launching_helper",
        "test_mpiexec_by_hand",
    }


def test_the_collected_whole_job_tests_carry_the_slow_mark(request):
    launching = [
        item
        for item in request.session.items
        if getattr(item, "function", None) is not None
        and whole_jobs.starts_a_job(str(item.path), item.function.__name__)
    ]
    assert all(item.get_closest_marker("slow") for item in launching)


def test_a_job_started_by_a_test_not_marked_slow_fails_it():
    # the command lines are put together at run time, so the source scan does not see
    # them and this test stays unmarked, as a test the scan missed would be
    launch_job = [sys.executable, "-m", "hpcpar", "lau" + "nch"]
    with pytest.raises(AssertionError, match="starts a whole job"):
        subprocess.Popen([*launch_job, "-n", "2", "--", "info"])
    with pytest.raises(AssertionError, match="starts a whole job"):
        subprocess.Popen(["/usr/bin/" + "mpi" + "exec", "-n", "2", "true"])
    done = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True)
    assert done.stdout.strip() == "1"  # anything else runs as before
