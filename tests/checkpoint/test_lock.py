"""The checkpoint directory's lock: a second job is refused and told who holds it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hpcpar.checkpoint import Checkpointer, CheckpointError
from mpi4py import MPI

from hpcpar.launcher import detached_env

pytestmark = pytest.mark.slow  # starts whole jobs: left out of dev.py test --quick


def test_a_second_job_is_refused_and_named(tmp_path):
    holder = textwrap.dedent(
        f"""
        import sys, time
        from hpcpar.checkpoint import Checkpointer
        ck = Checkpointer({str(tmp_path / "ck")!r}, levels=["local"])
        print("locked", flush=True)
        sys.stdin.readline()
        ck.close()
        """
    )
    job = subprocess.Popen(
        [sys.executable, "-c", holder],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=detached_env(),
    )
    try:
        assert job.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointError, match=f"in use by process {job.pid} on "):
            Checkpointer(tmp_path / "ck", comm=MPI.COMM_SELF)
    finally:
        job.communicate("\n", timeout=60)
    with Checkpointer(tmp_path / "ck", comm=MPI.COMM_SELF) as ck:
        assert ck.versions() == []
