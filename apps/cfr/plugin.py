"""The CFR app's part of hpcpar: ``hpcpar cfr``, ``hpcpar bench cfr`` and a demo step.

Named in the entry-point group ``hpcpar.plugins`` (setup.cfg); importing it registers
the command (``cli``), the benchmark (``bench``) and the tour step below.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hpcpar.cli.tour import Step, result_of, run_command
from hpcpar.plugins import TourStep, register

from . import bench, cli

__all__ = ["bench", "cli"]


def _step(comm: Any, h: Any, folder: Path, say: Any) -> Step:
    """DCFR on Leduc poker to exploitability 0.002."""
    start = time.perf_counter()
    out = folder / "cfr.json"
    argv = [
        "cfr",
        "--game",
        "leduc_poker",
        "--algorithm",
        "dcfr",
        "--iterations",
        "2000",
        "--eval-every",
        "10",
        "--target-exploitability",
        "0.002",
        "--out",
        str(out),
    ]
    layout = ["--layout", h.layout] if h.layout else []
    status = run_command(comm, argv + layout, folder / "cfr.log")
    gap = result_of(comm, out, "exploitability")
    ok = status == 0 and gap is not None and gap < 0.002
    iterations = result_of(comm, out, "iterations")
    figure = (
        f"Leduc, DCFR: exploitability {gap:.2e} after {iterations} iterations"
        if ok
        else (f"exit status {status}, exploitability {gap}")
    )
    return Step(
        "CFR on Leduc poker",
        ok,
        figure,
        time.perf_counter() - start,
        ["cfr.json", "cfr.png", "cfr.log"],
    )


register(TourStep("CFR on Leduc poker", 30, _step))
