"""Launch planning (pure: a fake MPI installation, no job started)."""

from __future__ import annotations

import sys

import pytest

from hpcpar.errors import LaunchError, LayoutError
from hpcpar.launcher import oversubscription_env, plan_launch
from hpcpar.runtime.mpiinfo import MPIInstallation, find_mpi, vendor_of

MPICH = MPIInstallation(
    "mpich",
    "MPICH Version: 5.0.2",
    "/opt/mpich/lib/libmpi.so.12",
    "/opt/mpich/bin/mpiexec",
    "next to libmpi",
)
OPENMPI = MPIInstallation(
    "openmpi",
    "Open MPI v5.0.5",
    "/opt/ompi/lib/libmpi.so.40",
    "/opt/ompi/bin/mpiexec",
    "next to libmpi",
)


def plan(ranks=4, command=("demo",), **kw):
    kw.setdefault("mpi", MPICH)
    kw.setdefault("cores", 2)
    kw.setdefault("environ", {})
    kw.setdefault("known_commands", {"demo", "info"})
    return plan_launch(ranks, list(command), **kw)


def test_hpcpar_command_runs_through_this_python():
    p = plan()
    assert p.argv == ["/opt/mpich/bin/mpiexec", "-n", "4", sys.executable, "-m", "hpcpar", "demo"]


def test_oversubscribed_mpich_yields():
    assert plan(ranks=4, cores=2).env == {
        "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "true",
        "MPIR_CVAR_POLLS_BEFORE_YIELD": "1",
        "MPIR_CVAR_PRINT_ERROR_STACK": "0",
    }
    assert plan(ranks=2, cores=2).env == {"MPIR_CVAR_PRINT_ERROR_STACK": "0"}


def test_mpich_fatal_errors_are_one_line_unless_the_user_asks_for_the_stack():
    asked = {"MPIR_CVAR_PRINT_ERROR_STACK": "1"}
    assert "MPIR_CVAR_PRINT_ERROR_STACK" not in plan(ranks=2, cores=2, environ=asked).env


def test_openmpi_defaults(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 0)
    env = oversubscription_env("openmpi", 8, 2)
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert env["OMPI_MCA_rmaps_base_oversubscribe"] == "1"


def test_script_runs_under_the_abort_runner(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("print('hi')\n")
    p = plan(command=[str(script), "--flag"])
    assert p.argv[3:] == [sys.executable, "-m", "hpcpar.run", str(script), "--flag"]


def test_python_means_this_python():
    assert plan(command=["python", "-m", "pytest"]).argv[3:] == [sys.executable, "-m", "pytest"]


def test_layout_is_passed_and_checked():
    assert plan(layout="ppn:2").env["HPCPAR_LAYOUT"] == "ppn:2"
    with pytest.raises(LayoutError, match="job has 4"):
        plan(layout="nodes:2,1")


def test_srun_inside_slurm(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    p = plan(environ={"SLURM_JOB_ID": "12"})
    assert p.launcher == "srun"
    assert p.argv[:4] == ["srun", "--ntasks=4", "--mpi=pmi2", "--kill-on-bad-exit=1"]
    assert plan(environ={"SLURM_JOB_ID": "12"}, mpi=OPENMPI).argv[2] == "--mpi=pmix"
    assert plan(environ={"SLURM_JOB_ID": "12"}, launcher="mpiexec").launcher == "mpiexec"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ranks": 0}, "at least 1"),
        ({"command": []}, "nothing to run"),
        ({"command": ["no_such_script.py"]}, "script not found: no_such_script.py"),
        ({"command": ["no-such-program-xyz"]}, "command not found"),
        ({"launcher": "qsub"}, "unknown launcher"),
        ({"mpi": MPIInstallation("mpich", "v", None, None, "PATH")}, "no mpiexec"),
    ],
)
def test_bad_launches_are_one_line_errors(kwargs, message):
    with pytest.raises(LaunchError, match=message) as info:
        plan(**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.reliability("bad_input")
def test_far_more_ranks_than_cores_needs_oversubscribe():
    with pytest.raises(LaunchError, match=r"-n 99999 is more than 8 ranks per core on the 2 "):
        plan(99999)
    assert plan(16).argv[2] == "16"  # 8 per core: still allowed
    assert plan(99999, oversubscribe=True).argv[2] == "99999"
    assert plan(99999, launcher="srun").argv[1] == "--ntasks=99999"  # Slurm's to refuse


def test_find_mpi_matches_the_loaded_library():
    mpi = find_mpi()
    assert mpi.vendor in ("mpich", "openmpi", "intel", "mvapich", "other")
    assert mpi.mpiexec is not None
    if mpi.libmpi and mpi.mpiexec_source == "next to libmpi":
        from pathlib import Path

        assert Path(mpi.mpiexec).parent == Path(mpi.libmpi).resolve().parent.parent / "bin"


@pytest.mark.parametrize(
    ("text", "vendor"),
    [
        ("MPICH Version: 5.0.2", "mpich"),
        ("Open MPI v5.0.5, package", "openmpi"),
        ("Intel(R) MPI Library 2021.13", "intel"),
        ("MVAPICH2 Version 2.3", "mvapich"),
        ("Foo MPI", "other"),
    ],
)
def test_vendor_of(text, vendor):
    assert vendor_of(text) == vendor


@pytest.mark.slow
@pytest.mark.alone  # the shared memory of jobs run beside it would count as leaked
@pytest.mark.skipif(not __import__("os").path.isdir("/dev/shm"), reason="needs /dev/shm")
@pytest.mark.timeout(120)
def test_a_killed_job_leaves_no_mpich_shared_memory(tmp_path):
    """MPICH never unlinks its segments when a rank dies; the launcher removes them."""
    import os
    import subprocess

    if find_mpi().vendor != "mpich":
        pytest.skip("the leak and its clean-up are MPICH's")
    script = tmp_path / "die.py"
    script.write_text(
        "import os, signal\n"
        "import numpy as np\n"
        "from mpi4py import MPI\n"
        "c = MPI.COMM_WORLD\n"
        "x = np.ones(4)\n"
        "c.Allreduce(MPI.IN_PLACE, x)  # the node's shared memory is in use now\n"
        "if c.rank == 0:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "c.Barrier()\n"
    )
    mine = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "HPCPAR_"))}
    before = {n for n in os.listdir("/dev/shm") if n.startswith("mpich_shm_")}
    run = subprocess.run(
        [sys.executable, "-m", "hpcpar", "launch", "-n", "2", "--", "python", str(script)],
        env=mine,
        capture_output=True,
        timeout=100,
    )
    assert run.returncode != 0
    left = {n for n in os.listdir("/dev/shm") if n.startswith("mpich_shm_")} - before
    assert not left, left


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("ender", [0, 2])
def test_a_rank_that_ends_the_job_on_purpose_gives_the_job_its_status(tmp_path, ender):
    """The MPI launcher reports whichever rank it saw end first (or its kill of the rest);
    hpcpar launch reports the status the ending rank chose, and no rank as lost."""
    import os
    import subprocess

    script = tmp_path / "end.py"
    script.write_text(
        "import os, time\n"
        "import hpcpar\n"
        "from hpcpar.runtime.exits import mark_ended\n"
        "comm = hpcpar.default_comm()\n"
        "hpcpar.barrier()\n"
        f"if comm.Get_rank() == {ender}:\n"
        "    mark_ended(4)\n"
        "    os._exit(4)\n"
        "time.sleep(60)\n"
    )
    mine = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "HPCPAR_"))}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcpar",
            "launch",
            "-n",
            "3",
            "--timeout",
            "90",
            "--",
            "python",
            str(script),
        ],
        env=mine,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode == 4, run.stderr
    assert "left the job without finishing" not in run.stderr, run.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_a_killed_launcher_takes_its_whole_job_with_it(tmp_path):
    """SIGKILL to hpcpar launch (no chance to clean up) still ends mpiexec, proxies, ranks."""
    import os
    import signal
    import subprocess
    import time

    script = tmp_path / "wait.py"
    script.write_text(
        "import os, sys, time\n"
        "from mpi4py import MPI\n"
        "MPI.COMM_WORLD.Barrier()\n"
        "open(os.path.join(sys.argv[1], f'rank-{os.getpid()}'), 'w').close()\n"
        "time.sleep(100)\n"
    )
    mine = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "HPCPAR_"))}
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpcpar",
            "launch",
            "-n",
            "3",
            "--",
            "python",
            str(script),
            str(tmp_path),
        ],
        env=mine,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank-*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = [int(p.name.split("-")[1]) for p in tmp_path.glob("rank-*")]
        assert len(ranks) == 3
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)

        def alive(pid):
            try:
                return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False

        deadline = time.monotonic() + 30
        while any(map(alive, ranks)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in ranks if alive(pid)]
    finally:
        if launcher.poll() is None:
            launcher.kill()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_process_of_the_job_outside_its_process_group_ends_with_the_job(tmp_path):
    """A process of the job in a session of its own (as the virtual cluster's MPI proxies
    are) is not reached by the kill of the job's group; the launcher ends it too."""
    import os
    import subprocess
    import time

    script = tmp_path / "stray.py"
    script.write_text(
        "import subprocess, sys\n"
        "from mpi4py import MPI\n"
        "if MPI.COMM_WORLD.rank == 0:\n"
        "    p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],\n"
        "                         start_new_session=True, stdout=subprocess.DEVNULL,\n"
        "                         stderr=subprocess.DEVNULL)\n"
        "    open(sys.argv[1], 'w').write(str(p.pid))\n"
        "MPI.COMM_WORLD.Barrier()\n"
    )
    mine = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "HPCPAR_"))}
    pid_file = tmp_path / "stray.pid"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcpar",
            "launch",
            "-n",
            "2",
            "--",
            "python",
            str(script),
            str(pid_file),
        ],
        env=mine,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr
    stray = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{stray}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(stray, 9)
        raise AssertionError("the job's process in another session outlived the job")


FAILING_RANK = """
import ctypes, os, sys, time
import numpy as np
import hpcpar
rank = hpcpar.default_comm().Get_rank()
hpcpar.allreduce(np.ones(3))


def fail(how):
    if how == "segfault":
        ctypes.string_at(0)
    elif how == "abort":
        os.abort()
    os._exit(0)


if rank == 2:
    time.sleep(0.3)
    fail(sys.argv[1])
hpcpar.allreduce(np.ones(3))
"""


@pytest.mark.slow
@pytest.mark.alone  # which rank left first is told apart by when its connection ended:
# on a machine busy with other jobs the launcher may see two ends at once
@pytest.mark.timeout(120)
@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("segfault", "(Segmentation fault at {script}:11 in fail)"),
        ("abort", "(Aborted at {script}:13 in fail)"),
        ("exit0", "(os._exit or a signal)"),
    ],
)
def test_the_rank_that_failed_first_is_named_with_the_documented_status(tmp_path, how, said):
    """Rank 2 of 4 crashes or leaves; the MPI launcher then kills the other three. The
    report names rank 2 alone (with the line it died on, for a fatal signal), and the
    job exits 3 whatever status the MPI launcher gave."""
    from launching import launch

    script = tmp_path / "fail.py"
    script.write_text(FAILING_RANK)
    done = launch(4, sys.executable, str(script), how)
    assert done.returncode == 3, (done.returncode, done.stderr)
    line = next(x for x in done.stderr.splitlines() if x.startswith("hpcpar launch:"))
    assert line == (
        f"hpcpar launch: rank(s) 2 left the job without finishing {said.format(script=script)}; "
        "the MPI launcher then ended rank(s) 0,1,3. Exit status 3"
    ), done.stderr


COUNT_AT_100 = """
import numpy as np
import hpcpar
rank = hpcpar.default_comm().Get_rank()
for call in range(200):
    total = hpcpar.allreduce(np.ones(5 if call == 100 and rank == 1 else 3), algorithm="mpi")
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.reliability("bad_input")
def test_a_count_mismatch_the_mpi_library_ends_the_job_for_is_a_collective_mismatch(tmp_path):
    """Between two of the guard's comparisons (call #100) rank 1 passes a longer count to
    the library's own allreduce: MPICH ends the job from inside the call (a truncated
    message is fatal there). One line from the library, one from hpcpar naming the
    mismatch, exit status 1 as for any CollectiveMismatchError."""
    from launching import launch

    script = tmp_path / "count.py"
    script.write_text(COUNT_AT_100)
    done = launch(3, sys.executable, str(script))
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "CollectiveMismatchError on rank(s) " in done.stderr, done.stderr
    assert "the ranks passed different counts or dtypes to a collective" in done.stderr
    assert "error stack" not in done.stderr and len(done.stderr.splitlines()) <= 3, done.stderr
