"""hpcpar's GPU paths' Python, run on a host-memory stand-in for cupy.

Where no GPU is, the GPU tests skip. These run them again in child processes whose
``cupy`` and ``cupyx`` are tests/standin (device arrays wrap host memory and refuse
implicit conversion and mixing with numpy as cupy does; the pack kernel is a Python
loop following its CUDA source; 2D copies check their pitches), so the datatype,
point-to-point, collective, checkpoint and CFR GPU paths' offsets, pitches, launch
arguments and dispatch are checked against numpy on every run. It is not a GPU test:
the same tests run on cupy where a GPU is.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts whole jobs: left out of dev.py test --quick

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "standin"
MPI_ENV = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "true", "MPIR_CVAR_POLLS_BEFORE_YIELD": "1"}
PYTEST = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--with-mpi")


def _child(*args: str) -> str:
    """Run a command on the stand-in (it must succeed); return its output."""
    env = {**os.environ, **MPI_ENV, "PYTHONPATH": str(STANDIN)}
    done = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _passed(*args: str) -> int:
    """Run a pytest command on the stand-in; return how many passed (none may skip or fail)."""
    out = _child(*args)
    summary = re.search(r"(\d+) passed", out)
    assert summary and not re.search(r"\d+ (skipped|failed|error)", out), out[-3000:]
    return int(summary.group(1))


def test_serial_gpu_tests_pass_on_the_standin():
    passed = _passed(
        sys.executable,
        *PYTEST[1:],
        "tests/hpcpar/test_datatypes_choose.py",
        "tests/checkpoint/test_gpu.py",
        "tests/apps/test_cfr_gpu.py",
        "-k",
        "gpu or device",
    )
    assert passed >= 11  # 5 datatype, 3 checkpoint, 3 CFR


def test_gpu_datatype_benchmark_runs_on_the_standin(tmp_path):
    """``bench datatypes --gpu``: every GPU variant's bytes checked against numpy's."""
    out = tmp_path / "dt"
    _child(
        str(Path(sys.executable).parent / "hpcpar"),
        "bench",
        "datatypes",
        "--gpu",
        "--n",
        "8",
        "--large",
        "1MiB",
        "--no-roof",
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--min-time",
        "0.0005",
        "--max-iterations",
        "3",
        "--output",
        str(out),
    )
    rows = [
        r
        for r in json.loads(out.with_suffix(".json").read_text())["results"]
        if r["case"].startswith("GPU ")
    ]
    assert len({r["case"] for r in rows}) == 5 and all(r["valid"] for r in rows)
    assert {r["variant"] for r in rows} == {
        "hpcpar-device",
        "cupy-contiguous",
        "hpcpar-staged",
        "cupy-get",
        "hpcpar-device-unpack",
        "cupy-unpack",
        "cupy-take",
        "cupy-put",
    }


@pytest.mark.parametrize("ranks", [2, 3])
def test_mpi_gpu_tests_pass_on_the_standin(ranks):
    hpcpar = str(Path(sys.executable).parent / "hpcpar")
    passed = _passed(
        hpcpar,
        "launch",
        "-n",
        str(ranks),
        "--timeout",
        "200",
        "--",
        *PYTEST,
        "-m",
        "mpi",
        "tests/hpcpar/test_p2p_halo.py",
        "tests/hpcpar/test_collectives_large.py",
        "-k",
        "gpu or cupy",
    )
    assert passed == 10  # three point-to-point methods, six halo exchanges, the collectives
