"""The watchdog: a job whose ranks wait too long in one call is reported and ended, at
2-4 ranks, for collectives, checkpoint saves, early exits, mismatches and the MPI
library called directly; ranks that only compute for long are not reported."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launching import clean_env, hpcpar

pytestmark = pytest.mark.slow

JOB = str(Path(__file__).parent.parent / "helpers" / "watchdog_job.py")
LIMIT = 3.0
_RECORD: list = []


@pytest.fixture(autouse=True)
def _record(record_property):
    _RECORD[:] = [record_property]  # run() notes each hang's time to report
    yield
    _RECORD.clear()


def run(ranks: int, mode: str, *args: str, limit: float = LIMIT, **env: str):
    done = hpcpar(
        "launch",
        "-n",
        str(ranks),
        "--timeout",
        "90",
        "--watchdog",
        f"{limit:g}",
        "--",
        JOB,
        mode,
        *args,
        env=clean_env(**env),
        timeout=120,
    )
    ended = time.time()
    report = [
        line[len("hpcpar watchdog: ") :]
        for line in done.stderr.splitlines()
        if line.startswith("hpcpar watchdog: ")
    ]
    hang = re.search(r"hang from ([0-9.]+)", done.stdout)
    waited = ended - float(hang.group(1)) if hang else None
    if waited is not None and report and _RECORD:
        _RECORD[0]("time_to_report", round(waited, 2))
    return done, report, waited


def _ranks(report: list[str], pattern: str) -> str:
    return "\n".join(line for line in report if re.search(pattern, line))


@pytest.mark.reliability("hang")
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_rank_that_never_joins_an_allreduce_is_named_with_its_function(ranks):
    done, report, waited = run(ranks, "allreduce")
    assert done.returncode == 4, done.stderr
    last = ranks - 1
    head = report[0]
    assert head.startswith("allreduce #3 on world (mpi, count 3, float64): rank(s) "), report
    inside = ",".join(str(r) for r in range(last)) if last > 1 else "0"
    assert f"rank(s) {inside} waited" in head or f"rank(s) 0-{last - 1} waited" in head, head
    for r in range(last):
        assert _ranks(report, rf"^rank {r}: inside it for .*watchdog_job\.py:\d+ in main"), report
    about_last = _ranks(report, rf"^rank {last}: not in it; last call allreduce #2 on world")
    assert "in stuck_in_a_named_function" in about_last, report
    assert any("time.sleep(120)" in line for line in report), report
    assert report[-1].startswith("ending the job (exit status 4)")
    assert waited is not None, report  # the hang began and the job ended


@pytest.mark.reliability("hang")
@pytest.mark.parametrize(
    ("ranks", "mode", "operation"),
    [
        (2, "barrier", "barrier #3 on world (mpi)"),
        (3, "checkpoint", "checkpoint save #0 on checkpoint"),
    ],
)
def test_barriers_and_checkpoint_saves_are_watched_too(ranks, mode, operation):
    done, report, waited = run(ranks, mode)
    assert done.returncode == 4, done.stderr
    assert report[0].startswith(operation), report
    assert _ranks(report, rf"^rank {ranks - 1}: not in it;.*in stuck_in_a_named_function"), report
    assert waited is not None, report  # the hang began and the job ended


@pytest.mark.reliability("hang")
def test_a_rank_that_exits_before_a_collective_is_reported():
    done, report, waited = run(3, "exit")
    assert done.returncode == 4, done.stderr
    assert report[0].startswith("allreduce #3 on world"), report
    assert _ranks(report, r"^rank 1: exited normally"), report
    assert _ranks(report, r"^rank 2: inside it"), report
    assert waited is not None, report  # the hang began and the job ended


@pytest.mark.reliability("hang")
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_hang_after_rank_0_finished_is_reported(ranks):
    """Rank 0 (which gathers the reports) ends its program; the others then hang, on the
    world or on a communicator without rank 0: still reported, and the job ended."""
    done, report, waited = run(ranks, "rank0_done")
    assert done.returncode == 4, done.stderr
    assert "rank 0 finished" in done.stdout
    # at 3-4 ranks the others wait in the first call on the new communicator: its set-up
    operation = "allreduce #3 on world" if ranks == 2 else "set-up #0 on a new communicator"
    assert report and report[0].startswith(operation), report
    assert _ranks(report, r"^rank 0: exited normally"), report
    if ranks > 2:
        assert _ranks(report, rf"^rank {ranks - 1}: not in it;.*stuck_in_a_named_function")
    assert report[-1].startswith("ending the job (exit status 4)")
    assert waited is not None, report  # the hang began and the job ended


@pytest.mark.reliability("hang")
def test_a_hang_in_the_data_parallel_communication_thread_is_reported_at_the_users_line():
    """DataParallel(overlap=True) reduces on a thread of its own while the main thread
    waits for it at the end of the backward pass: that wait is a wait in hpcpar, named
    with the user's line (loss.backward()), not the thread's or torch's."""
    pytest.importorskip("torch")
    done, report, waited = run(2, "torch_overlap")
    assert done.returncode == 4, done.stderr
    assert report and report[0].startswith(("allreduce #", "iallreduce #")), report
    backward = next(
        i
        for i, line in enumerate(Path(JOB).read_text().splitlines(), 1)
        if line.strip() == "loss.backward()"
    )
    assert _ranks(report, rf"^rank 0: inside it for .*watchdog_job\.py:{backward} in main"), report
    assert _ranks(report, r"^rank 1: not in it;.*stuck_in_a_named_function"), report
    assert waited is not None, report  # the hang began and the job ended


@pytest.mark.reliability("hang")
def test_a_rank_that_leaves_with_os_exit_ends_the_job_at_once_and_is_named():
    # MPICH's launcher ends the job when a rank leaves without finalizing MPI, before any
    # wait reaches the limit (with status 0, or that of the kill it sends the others);
    # hpcpar launch then names the rank that left, and exits 3
    done, report, _ = run(3, "os_exit")
    assert done.returncode == 3, done.stderr
    assert "rank(s) 1 left the job without finishing" in done.stderr, done.stderr
    assert report == [], done.stderr


@pytest.mark.reliability("bad_input")
def test_the_mismatch_guard_stops_different_collectives_where_it_compares():
    """At #3 the always-on guard compares the ranks' calls before any data moves: the
    job fails at once with the calls named, long before the watchdog's limit."""
    done, report, waited = run(3, "mismatch", "guarded", limit=30)
    assert done.returncode != 0 and report == [], done.stderr
    assert (
        "ranks differ at #3 on world: rank(s) 0 called allreduce (mpi, count 3, float64, "
        "op SUM); rank(s) 1,2 called bcast (mpi, count 5, float64, root 0)"
    ) in done.stderr, done.stderr
    assert waited is not None  # ended without the watchdog: its report is empty


@pytest.mark.reliability("hang")
def test_ranks_in_different_collectives_at_one_sequence_number_are_a_mismatch():
    done, report, _ = run(3, "mismatch")
    assert done.returncode == 4, done.stderr
    mismatch = _ranks(report, r"^mismatch at world #4: ")
    assert "rank(s) 0 called allreduce (mpi, count 3, float64)" in mismatch, report
    assert "rank(s) 1,2 called bcast (mpi, count 5, float64, root/peer 0)" in mismatch, report


@pytest.mark.reliability("hang")
def test_the_mpi_library_called_directly_is_watched():
    done, report, _ = run(2, "mpi4py")
    assert done.returncode == 4, done.stderr
    assert report[0].startswith("an MPI call: rank(s) 0 waited"), report
    assert _ranks(report, r"^rank 1: not in it;.*in stuck_in_a_named_function"), report


@pytest.mark.reliability("hang")
@pytest.mark.parametrize("ranks", [3, 4])
def test_every_rank_blocked_in_a_direct_mpi_call_is_named_in_it(ranks):
    """The library's Barrier called directly, entered at different times, the last rank
    never coming: every rank blocked in it, also one that has waited less than the limit,
    is named in an MPI call at its line, not "not in it" with an older hpcpar call."""
    done, report, _ = run(ranks, "mpi4py_staggered")
    assert done.returncode == 4, done.stderr
    assert report and report[0].startswith("an MPI call: rank(s) "), report
    for r in range(ranks - 1):
        line = _ranks(report, rf"^rank {r}: ")
        assert re.search(r"in an MPI call for [0-9.]+ s at .*watchdog_job\.py:\d+ in main", line), (
            report
        )
    assert _ranks(report, rf"^rank {ranks - 1}: not in it;.*stuck_in_a_named_function"), report


def test_no_report_when_every_rank_computes_longer_than_the_limit():
    done, report, _ = run(4, "compute", "5", limit=1.5)
    assert done.returncode == 0, done.stderr
    assert report == [] and done.stdout.count("finished") == 4, done.stderr


def test_report_only_lets_a_late_rank_finish():
    done, report, _ = run(2, "late", "4", limit=1.5, HPCPAR_WATCHDOG_ACTION="report")
    assert done.returncode == 0, done.stderr
    assert report[0].startswith("allreduce #3 on world"), report
    assert report[-1] == "the job goes on (HPCPAR_WATCHDOG_ACTION=report)"
    assert done.stdout.count("finished") == 2


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("HPCPAR_WATCHDOG", "soon", "HPCPAR_WATCHDOG='soon': expected a number of seconds"),
        ("HPCPAR_WATCHDOG_ACTION", "reboot", "HPCPAR_WATCHDOG_ACTION='reboot': expected abort"),
    ],
)
def test_bad_settings_are_one_line_and_status_2(variable, value, message):
    env = {"HPCPAR_WATCHDOG": "5", variable: value}
    done = hpcpar("launch", "-n", "2", "--timeout", "60", "--", "info", env=clean_env(**env))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.reliability("bad_input")
def test_bad_settings_inside_a_job_started_by_hand_are_one_line_on_every_rank():
    from hpcpar.launcher import plan_launch

    mpiexec = plan_launch(2, ["info"], known_commands=["info"]).argv[0]
    env = clean_env(HPCPAR_WATCHDOG="-1")
    done = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, "-m", "hpcpar", "info"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "hpcpar: error: HPCPAR_WATCHDOG='-1': expected a number of seconds above 0"
    ), done.stderr


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize("algorithm", ["auto", "ring"])
def test_a_count_that_differs_in_one_collective_fails_at_once_instead_of_hanging(algorithm):
    # the MPI library refuses the longer message (truncation): a CollectiveMismatchError
    # that aborts the job on the spot, well before the watchdog's limit
    done, report, waited = run(3, "counts", algorithm, limit=30)
    assert done.returncode != 0 and report == [], done.stderr
    assert (
        "CollectiveMismatchError: allreduce: a message from another rank was longer than "
        "this rank expected"
    ) in done.stderr, done.stderr
    assert "the ranks passed different counts or dtypes; HPCPAR_CHECK=1 names them" in done.stderr
    assert waited is not None  # ended without the watchdog: its report is empty


def test_hpcpar_code_waits_in_a_call_but_its_command_line_tools_do_not():
    """A sweep polling Slurm from inside hpcpar's tools for longer than the limit is not a
    hang; a frame in hpcpar's collectives is."""
    import os

    import hpcpar.cli as cli_package
    import hpcpar.collectives as collectives_package
    from hpcpar.runtime.watchdog import blocked_in

    def frame_in(package):
        where = os.path.join(os.path.dirname(package.__file__), "frame_probe.py")
        space: dict = {}
        exec(compile("import sys\nframe = sys._getframe()", where, "exec"), space)
        return space["frame"]

    assert blocked_in(frame_in(collectives_package)) == "hpcpar"
    assert blocked_in(frame_in(cli_package)) is None


def test_a_frame_without_a_current_line_is_not_taken_for_a_wait():
    """A frame being set up has ``f_lineno`` None: the monitor samples it without failing."""
    from types import SimpleNamespace

    from hpcpar.runtime.watchdog import blocked_in

    frame = SimpleNamespace(f_code=SimpleNamespace(co_filename=__file__), f_lineno=None)
    assert blocked_in(frame) is None
