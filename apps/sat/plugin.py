"""The SAT app's part of hpcpar: ``hpcpar sat``, ``hpcpar bench sat`` and a demo step.

Named in the entry-point group ``hpcpar.plugins`` (setup.cfg); importing it registers
the command (``cli``), the benchmark (``bench``) and the tour step below.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hpcpar.cli.tour import Step, run_command
from hpcpar.plugins import TourStep, register

from . import bench, cli

__all__ = ["bench", "cli"]


def _step(comm: Any, h: Any, folder: Path, say: Any) -> Step:
    """A planted 3-SAT instance of 3,000 variables solved by the MPI portfolio."""
    from .cnf import random_ksat, write_dimacs

    start = time.perf_counter()
    path = folder / "sat.cnf"
    if comm.Get_rank() == 0:
        cnf, _ = random_ksat(3000, 12600, 3, seed=7, planted=True)
        write_dimacs(cnf, path)
    comm.Barrier()
    argv = ["sat", "solve", str(path), "--portfolio", "--timeout", "60", "--seed", "3"]
    status = run_command(comm, argv, folder / "sat.log")
    ok = status == 10  # SATISFIABLE, model checked against the formula before printing
    text = (folder / "sat.log").read_text() if comm.Get_rank() == 0 else ""
    winner = next(
        (
            line[2:].split(";")[0].strip()
            for line in text.splitlines()
            if line.startswith("c solved by")
        ),
        "",
    )
    found = f"3000 variables, 12600 clauses: SATISFIABLE{'; ' + winner if winner else ''}"
    figure = comm.bcast(found if ok else f"exit status {status}", root=0)
    return Step("SAT portfolio", ok, figure, time.perf_counter() - start, ["sat.cnf", "sat.log"])


register(TourStep("SAT portfolio", 50, _step))
