"""The graph app's part of hpcpar: ``hpcpar graph``, ``hpcpar bench graph``, a demo step.

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
    """Graph500 BFS at SCALE 14 on the node-first partition, every search validated."""
    start = time.perf_counter()
    out = folder / "graph.json"
    argv = [
        "graph",
        "bfs",
        "--scale",
        "14",
        "--roots",
        "8",
        "--partition",
        "hier",
        "--out",
        str(out),
    ]
    layout = ["--layout", h.layout] if h.layout else []
    status = run_command(comm, argv + layout, folder / "graph.log")
    teps = result_of(comm, out, "bfs_harmonic_mean_teps")
    ok = status == 0 and teps is not None
    figure = (
        (f"SCALE 14, hier partition, 8 keys validated: {teps / 1e6:.1f} MTEPS (harmonic mean)")
        if ok
        else "failed"
    )
    return Step(
        "Graph500 BFS",
        ok,
        figure,
        time.perf_counter() - start,
        ["graph.json", "graph.png", "graph.log"],
    )


register(TourStep("Graph500 BFS", 40, _step))
