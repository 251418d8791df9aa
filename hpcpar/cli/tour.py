"""The demo's tour: the steps registered as ``TourStep`` (``hpcpar.plugins``), in order.

The core's step is a 1 MiB allreduce with ``explain()``; each app adds its own from its
``plugin`` module (a killed and resumed SGD job, CFR, Graph500 BFS, SAT). A step runs a
real ``hpcpar`` command with small parameters (``run_command``) and its results files go
under the results folder, with the full output of each in-process command in
``STEP.log`` there; the tour prints one line per step and a summary table.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..plugins import TourStep, register, tour_steps

__all__ = ["Step", "tour", "run_command", "result_of", "all_true"]


@dataclass
class Step:
    """One step of the tour: whether it passed, its headline figure, time and files."""

    name: str
    ok: bool
    figure: str
    seconds: float
    files: list[str] = field(default_factory=list)


def run_command(comm: Any, argv: list[str], log: Path) -> int:
    """Run ``hpcpar ARGV`` in this job (collective), rank 0's output into ``log``."""
    from ..plugins import commands
    from .main import build_parser

    args = build_parser().parse_args(argv)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        status = commands()[argv[0]].run(comm, args)
    if comm.Get_rank() == 0:
        log.write_text(buffer.getvalue())
    return int(status or 0)


def _explain(comm: Any, h: Any, folder: Path, say: Any) -> Step:
    """A 1 MiB allreduce with ``algorithm="auto"``, and ``explain()`` of its choice."""
    from ..collectives import allreduce, explain

    start = time.perf_counter()
    plan = explain("allreduce", 1 << 20, comm=h)
    say(str(plan))
    import numpy as np

    x = np.full(1 << 17, comm.Get_rank() + 1.0)  # 1 MiB of float64
    got = allreduce(x, comm=h)  # algorithm="auto": the plan above
    n = comm.Get_size()
    ok = all_true(comm, bool(np.all(got == n * (n + 1) / 2)))
    if comm.Get_rank() == 0:
        (folder / "explain.txt").write_text(str(plan) + "\n")
    return Step(
        "collective + explain",
        ok,
        f"allreduce 1 MiB: {plan.algorithm}",
        time.perf_counter() - start,
        ["explain.txt"],
    )


def all_true(comm: Any, ok: bool) -> bool:
    """Whether ``ok`` holds on every rank (collective)."""
    from mpi4py import MPI

    return bool(comm.allreduce(bool(ok), op=MPI.LAND))


def result_of(comm: Any, path: Path, key: str) -> Any:
    """``results[key]`` of a results file written by rank 0, on every rank (or None)."""
    value = None
    if comm.Get_rank() == 0:
        with contextlib.suppress(OSError, ValueError, KeyError):
            value = json.loads(path.read_text())["results"][key]
    return comm.bcast(value, root=0)


def tour(comm: Any, h: Any, folder: Path, say: Any) -> list[Step]:
    """Run every step (collective); the steps, also written to ``folder/tour.json``."""
    if comm.Get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
    comm.Barrier()
    steps = []
    for registered in tour_steps():
        step = registered.run(comm, h, folder, say)
        present = [f for f in step.files if (folder / f).exists()] if comm.Get_rank() == 0 else None
        step.files = comm.bcast(present, root=0)  # plots only where matplotlib is installed
        say(
            f"  {'ok    ' if step.ok else 'FAILED'}  {step.name}: {step.figure} "
            f"({step.seconds:.1f} s)",
            flush=True,
        )
        steps.append(step)
    say(f"\n{'step':<22} {'result':<7} {'seconds':>8}  files (in {folder})")
    for s in steps:
        say(f"{s.name:<22} {'ok' if s.ok else 'FAILED':<7} {s.seconds:8.1f}  {', '.join(s.files)}")
    if comm.Get_rank() == 0:
        doc = [
            {"step": s.name, "ok": s.ok, "figure": s.figure, "seconds": s.seconds, "files": s.files}
            for s in steps
        ]
        (folder / "tour.json").write_text(json.dumps(doc, indent=2) + "\n")
    return steps


register(TourStep("collective + explain", 10, _explain))
