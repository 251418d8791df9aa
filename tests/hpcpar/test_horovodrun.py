"""``hpcpar horovodrun``: Horovod's command line as an hpcpar job, and its refusals;
Horovod scripts whose ranks disagree on a collective end with one line on every rank."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from launching import clean_env, hpcpar

from hpcpar.cli.horovodrun import parse_hosts
from hpcpar.errors import UsageError

pytest.importorskip("torch", reason="hpcpar.horovod.torch needs torch")

MISMATCH = str(Path(__file__).parents[1] / "helpers" / "horovod_mismatch_job.py")


def test_flags_become_horovods_variables_and_hosts_the_launchers():
    done = hpcpar(
        "horovodrun",
        "-np",
        "2",
        "--dry-run",
        "--fusion-threshold-mb",
        "32",
        "--hierarchical-allreduce",
        "--timeline-filename",
        "tl.json",
        "python",
        "train.py",
    )
    assert done.returncode == 0, done.stderr
    assert "export HOROVOD_FUSION_THRESHOLD=33554432" in done.stdout
    assert "export HOROVOD_HIERARCHICAL_ALLREDUCE=1" in done.stdout
    assert "HOROVOD_TIMELINE=/" in done.stdout  # made absolute
    assert " -n 2 " in done.stdout and done.stdout.rstrip().endswith("train.py")
    remote = hpcpar(
        "horovodrun", "-np", "3", "-H", "nodeA:2,nodeB:1", "--dry-run", "python", "t.py"
    )
    assert remote.returncode == 0 and "-hosts nodeA:2,nodeB:1" in remote.stdout


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    "argv, message",
    [
        (["-np", "3", "-H", "localhost:2"], "-np 3 needs 3 slots; the hosts give 2"),
        (["-np", "2", "--min-np", "1"], "--min-np is not supported"),
        (["-np", "2", "--gloo"], "--gloo is not supported"),
        (["-np", "2", "-H", "a:x"], "bad host entry 'a:x'"),
        (["-np", "2", "--hostfile", "/nonexistent/hosts"], "cannot read --hostfile"),
    ],
)
def test_what_cannot_run_is_one_line_and_status_2(argv, message):
    done = hpcpar("horovodrun", *argv, "python", "train.py")
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_hostfile_lines_as_horovod_writes_them():
    assert parse_hosts("host1 slots=2\nhost2:3\n# a comment\nhost3\n", "f") == [
        ("host1", 2),
        ("host2", 3),
        ("host3", 1),
    ]
    with pytest.raises(UsageError, match="names no host"):
        parse_hosts("\n# nothing\n", "f")


@pytest.mark.slow
def test_a_horovod_script_runs_under_horovodrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, hpcpar.horovod.torch as hvd\n"
        "hvd.init()\n"
        "x = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)\n"
        "print(f'rank {hvd.rank()} of {hvd.size()} sum {x.item():g}')\n"
    )
    done = hpcpar("horovodrun", "-np", "2", sys.executable, str(script), env=clean_env())
    assert done.returncode == 0, done.stderr
    assert "rank 0 of 2 sum 1" in done.stdout and "rank 1 of 2 sum 1" in done.stdout


@pytest.mark.slow
def test_a_horovod_script_runs_under_plain_mpiexec(tmp_path):
    import subprocess

    from hpcpar.launcher import find_mpi

    script = tmp_path / "train.py"
    script.write_text(
        "import torch, hpcpar.horovod.torch as hvd\n"
        "hvd.init()\n"
        "x = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)\n"
        "print(f'rank {hvd.rank()} of {hvd.size()} sum {x.item():g}')\n"
    )
    mpiexec = find_mpi().mpiexec
    done = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    assert "rank 0 of 2 sum 1" in done.stdout and "rank 1 of 2 sum 1" in done.stdout


@pytest.mark.slow
@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize("kind", ["shape", "dtype"])
@pytest.mark.parametrize("check", ["0", "1"])
def test_ranks_that_disagree_end_the_job_with_the_difference_named(kind, check):
    """Without checks the MPI library finds the longer message and ends the job (the
    launcher names the mismatch in one line when it sees that rank's abort first);
    with ``HPCPAR_CHECK=1`` every rank raises Horovod's ``HorovodInternalError``
    naming the difference before any data moves."""
    done = hpcpar(
        "launch",
        "-n",
        "2",
        "--timeout",
        "60",
        "--",
        sys.executable,
        MISMATCH,
        kind,
        env=clean_env(HPCPAR_CHECK=check),
    )
    assert done.returncode != 0 and "WRONG" not in done.stdout, done.stdout
    if check == "1":
        for rank in (0, 1):
            assert (
                f"[{rank}/2] hpcpar.horovod.basics.HorovodInternalError: allreduce: ranks "
                f"passed different {'count' if kind == 'shape' else 'dtype'}" in done.stderr
            )
    else:  # which rank's abort the launcher sees first varies; each names the cause
        named = ("hpcpar launch: CollectiveMismatchError", "Message truncated")
        assert any(n in done.stderr for n in named), done.stderr[-3000:]
