"""Runtime core: default communicator, comm resolution, logging, abort formatting, results."""

from __future__ import annotations

import csv
import json
import logging
import sys

import numpy as np
import pytest
from mpi4py import MPI

import hpcpar
from hpcpar.errors import CommunicatorError, HpcparError
from hpcpar.runtime.abort import format_exception_for_rank
from hpcpar.runtime.comm import resolve_comm
from hpcpar.runtime.env import launcher_rank_size
from hpcpar.runtime.log import get_logger
from hpcpar.runtime.results import write_csv, write_json
from hpcpar.testing import assert_all


@pytest.mark.mpi
def test_default_comm_is_a_cached_duplicate_of_world(comm):
    first = hpcpar.default_comm()
    assert first is hpcpar.default_comm()
    assert MPI.Comm.Compare(first, MPI.COMM_WORLD) == MPI.CONGRUENT
    assert first.Get_name() == "hpcpar"


@pytest.mark.mpi
def test_resolve_comm(comm):
    assert resolve_comm(None) is hpcpar.default_comm()
    assert resolve_comm(MPI.COMM_SELF) is MPI.COMM_SELF
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        assert resolve_comm(h) is h.comm
    for bad in ("world", 3, MPI.COMM_NULL):
        with pytest.raises(CommunicatorError):
            resolve_comm(bad)


def test_import_does_not_start_mpi():
    import subprocess

    code = "import hpcpar, sys; print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_launcher_path_does_not_start_mpi():
    # 'hpcpar launch' must not become an MPI process before it starts mpiexec
    import subprocess

    code = (
        "import sys; from hpcpar.cli.main import build_parser; build_parser(); "
        "print('mpi4py.MPI' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_collectives_work_after_the_launcher_looked_at_the_library():
    """Describing the MPI library (what 'hpcpar launch' does first) loads mpi4py without
    MPI_Init; a collective afterwards in the same process initialises MPI instead of
    MPICH ending the process ("before initializing") with status 1."""
    import subprocess

    code = (
        "from hpcpar.runtime.mpiinfo import find_mpi; find_mpi(); import numpy as np, hpcpar; "
        "print(hpcpar.allreduce(np.arange(3.0)).tolist())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[0.0, 1.0, 2.0]", out.stderr


def test_errors_are_one_family():
    for name in ("UsageError", "LayoutError", "LaunchError", "CommunicatorError"):
        assert issubclass(getattr(hpcpar, name), HpcparError)


def test_launcher_rank_size(monkeypatch):
    for var in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    assert launcher_rank_size() == (0, 1)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    assert launcher_rank_size() == (3, 8)


def test_traceback_is_prefixed_with_rank():
    try:
        raise ValueError("bad value")
    except ValueError as exc:
        text = format_exception_for_rank(type(exc), exc, exc.__traceback__, 2, 4)
    lines = text.splitlines()
    assert all(line.startswith("[2/4] ") for line in lines)
    assert lines[-1] == "[2/4] ValueError: bad value"


def test_log_lines_carry_the_rank(capsys):
    log = get_logger("hpcpar.test")
    log.warning("hello %d", 5)
    err = capsys.readouterr().err
    rank, size = launcher_rank_size()
    assert f"[{rank}/{size}] hpcpar.test: WARNING: hello 5" in err
    assert logging.getLogger("hpcpar").level == (logging.INFO if rank == 0 else logging.WARNING)


@pytest.mark.mpi
def test_results_are_written_once_by_rank_zero(comm, tmp_path):
    folder = comm.bcast(str(tmp_path), root=0)
    target = write_json(
        f"{folder}/r.json",
        {"value": np.float64(1.5), "counts": np.arange(3)},
        comm=comm,
        layout="ppn:2",
        parameters={"n": np.int64(4), "tags": ("a", "b")},
    )
    write_csv(
        f"{folder}/r.csv", [{"size": 8, "t": 1.0}, {"size": 16, "t": 2.0, "extra": "x"}], comm=comm
    )
    comm.Barrier()
    if comm.Get_rank() == 0:
        doc = json.loads(target.read_text())
        meta = doc["metadata"]
        assert doc["results"] == {"value": 1.5, "counts": [0, 1, 2]}
        assert meta["ranks"] == comm.Get_size() and meta["layout"] == "ppn:2"
        assert meta["parameters"] == {"n": 4, "tags": ["a", "b"]}
        assert meta["mpi_library"] == " ".join(MPI.Get_library_version().splitlines()[0].split())
        assert meta["hpcpar_version"] == hpcpar.__version__
        with open(f"{folder}/r.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert rows == [
            {"size": "8", "t": "1.0", "extra": ""},
            {"size": "16", "t": "2.0", "extra": "x"},
        ]
    import os

    leftovers = [n for n in os.listdir(folder) if n.startswith(".")]
    assert_all(not leftovers, f"temporary files left: {leftovers}", comm)


@pytest.mark.mpi
def test_assert_all_names_the_failing_ranks(comm):
    size = comm.Get_size()
    with pytest.raises(AssertionError, match=rf"rank\(s\) {size - 1} of {size}"):
        assert_all(comm.Get_rank() != size - 1, "last rank differs", comm)
    assert_all(True, "never", comm)
