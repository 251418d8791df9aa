"""The GPU datatype and point-to-point paths' Python, run on a host-memory stand-in for cupy.

Where no GPU is, the GPU tests skip; these run them in a child process whose ``cupy`` is
tests/standin/cupy (device memory is host memory, the kernel a Python loop following
the CUDA source), so their offsets, pitches, launch arguments and dispatch are checked
against numpy on every run. It is not a GPU test: those run where cupy and a GPU are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "standin"
MPI_ENV = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "true", "MPIR_CVAR_POLLS_BEFORE_YIELD": "1"}


def _run(*args: str) -> str:
    env = {**os.environ, **MPI_ENV, "PYTHONPATH": str(STANDIN)}
    done = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_gpu_datatype_paths_on_the_standin():
    out = _run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--with-mpi",
               "tests/hpcpar/test_datatypes.py", "-k", "gpu or device")  # fmt: skip
    assert "5 passed" in out and "skipped" not in out, out[-2000:]


@pytest.mark.parametrize("ranks", [2, 3])
def test_gpu_point_to_point_on_the_standin(ranks):
    hpcpar = str(Path(sys.executable).parent / "hpcpar")
    out = _run(hpcpar, "launch", "-n", str(ranks), "--timeout", "200", "--", "python", "-m",
               "pytest", "-q", "-p", "no:cacheprovider", "--with-mpi", "-m", "mpi",
               "tests/hpcpar/test_p2p_halo.py", "-k", "gpu")  # fmt: skip
    assert "3 passed" in out and "skipped" not in out, out[-2000:]
