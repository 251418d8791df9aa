"""A test session that holds what the suite starts, for tests/jobs/test_teardown.py.

Run as ``pytest tests/helpers/teardown_session.py`` with ``READY_FILE`` set: its one
test brings up a local Slurm and a two-node virtual cluster (where this machine can)
and an MPI job, writes their process ids to ``READY_FILE`` and waits to be stopped. Its
fixtures tear everything down as the suite's own do; the outer test stops the session
in the middle and checks that nothing is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launching import clean_env
from slurm_cluster import LocalSlurm, why_not

SLEEPER = "from mpi4py import MPI; import time; MPI.COMM_WORLD.Barrier(); time.sleep(600)"


@pytest.fixture
def slurm(tmp_path):
    if why_not() is not None:
        yield None
        return
    with LocalSlurm(tmp_path / "slurm") as cluster:
        yield cluster


@pytest.fixture
def vcluster():
    from hpcpar.vcluster.netns import ClusterSpec, VClusterError, cluster

    try:
        with cluster(ClusterSpec(2, None), "teardown check"):
            yield True
    except VClusterError:
        yield False


@pytest.fixture
def job(tmp_path):
    argv = [sys.executable, "-m", "hpcpar", "launch", "-n", "2", "--", "python", "-c", SLEEPER]
    proc = subprocess.Popen(argv, env=clean_env(), cwd=tmp_path)
    yield proc
    proc.terminate()  # the launcher ends its whole job on SIGTERM
    proc.wait(timeout=60)


def _daemon_pids(cluster) -> list[int]:
    pids = []
    for name in ("munged", "slurmctld", "slurmd"):
        path = cluster.dir / f"{name}.pid"
        pids += [int(path.read_text().split()[0])] if path.exists() else []
    return pids


def _processes() -> dict[int, list[tuple[int, str]]]:
    """Every process's children: ppid -> [(pid, command line)], read from /proc."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append((int(entry.name), args))
    return children


def _mpi_ranks_started(launcher: int, ranks: int) -> list[int]:
    """The launcher's descendants once ``ranks`` MPI ranks run (pids), waiting up to 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = _processes()
        found, todo = [], [launcher]
        while todo:
            for pid, args in children.get(todo.pop(), []):
                found.append((pid, args))
                todo.append(pid)
        if sum(args.startswith(sys.executable) and "Barrier" in args for _, args in found) >= ranks:
            return [pid for pid, _ in found]
        time.sleep(0.2)
    raise AssertionError(f"the MPI job did not start within 60 s: {found}")


@pytest.mark.timeout(900)
def test_hold_until_stopped(slurm, vcluster, job):
    held = {
        "pytest": os.getpid(),
        "launcher": job.pid,
        "job": _mpi_ranks_started(job.pid, 2),
        "daemons": _daemon_pids(slurm) if slurm else [],
        "vcluster": vcluster,
    }
    Path(os.environ["READY_FILE"]).write_text(json.dumps(held))
    time.sleep(600)
