"""The demo's tour of the apps: explain, a killed and resumed SGD job, CFR, Graph500, SAT.

Each step runs a real ``hpcpar`` command with small parameters and its results files go
under the results folder; the full output of each in-process step goes to
``STEP.log`` there, and the tour prints one line per step and a summary table. The SGD
step is three separate jobs started by rank 0 while the other ranks wait (a job really
killed by ``SIGKILL`` after a checkpoint commit cannot be simulated inside this one):
an uninterrupted run, the run that is killed, and its resumption, whose model must equal
the uninterrupted one bit for bit.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Step", "tour"]


@dataclass
class Step:
    """One step of the tour: whether it passed, its headline figure, time and files."""

    name: str
    ok: bool
    figure: str
    seconds: float
    files: list[str] = field(default_factory=list)


def _in_process(comm: Any, argv: list[str], log: Path) -> int:
    """Run ``hpcpar ARGV`` in this job, rank 0's output into ``log``."""
    from .main import build_parser
    from .registry import commands

    args = build_parser().parse_args(argv)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        status = commands()[argv[0]].run(comm, args)
    if comm.Get_rank() == 0:
        log.write_text(buffer.getvalue())
    return int(status or 0)


def _explain(comm: Any, h: Any, folder: Path, say: Any) -> Step:
    from ..collectives import allreduce, explain

    start = time.perf_counter()
    plan = explain("allreduce", 1 << 20, comm=h)
    say(str(plan))
    import numpy as np

    x = np.full(1 << 17, comm.Get_rank() + 1.0)  # 1 MiB of float64
    got = allreduce(x, comm=h)  # algorithm="auto": the plan above
    n = comm.Get_size()
    ok = bool(comm.allreduce(bool(np.all(got == n * (n + 1) / 2)), op=_land()))
    if comm.Get_rank() == 0:
        (folder / "explain.txt").write_text(str(plan) + "\n")
    return Step("collective + explain", ok, f"allreduce 1 MiB: {plan.algorithm}",
                time.perf_counter() - start, ["explain.txt"])  # fmt: skip


def _land() -> Any:
    from mpi4py import MPI

    return MPI.LAND


def _sgd_jobs(folder: Path) -> tuple[bool, str]:
    """Rank 0: the uninterrupted, the killed and the resumed SGD jobs (2 ranks each)."""
    from ..launcher import detached_env

    base = [sys.executable, "-m", "hpcpar", "launch", "-n", "2", "--layout", "ppn:1",
            "--launcher", "mpiexec", "--timeout", "180", "--", "sgd", "--dataset", "synthetic",
            "--model", "mlp", "--hidden", "32", "--epochs", "2", "--batch", "256", "--lr",
            "0.1", "--mode", "sync"]  # fmt: skip
    ck = ["--checkpoint", str(folder / "sgd-checkpoint"), "--checkpoint-every", "20"]

    def job(out: str, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, "--out", str(folder / out), *extra], text=True,
                              capture_output=True, env=detached_env(**env), timeout=240,
                              check=False)  # fmt: skip

    plain = job("sgd-plain.json")
    # a checkpoint left by an earlier demo in this folder would be resumed, not killed
    shutil.rmtree(folder / "sgd-checkpoint", ignore_errors=True)
    killed = job("sgd.json", *ck, HPCPAR_CHECKPOINT_FAULT="kill=after-commit,step=60,rank=1")
    resumed = job("sgd.json", *ck)
    (folder / "sgd.log").write_text("\n".join(
        f"$ {name}: exit {p.returncode}\n{p.stdout}{p.stderr}"
        for name, p in (("uninterrupted", plain), ("killed", killed), ("resumed", resumed))
    ))  # fmt: skip
    import numpy as np

    same = (
        plain.returncode == 0 and resumed.returncode == 0 and killed.returncode != 0
        and (folder / "sgd.npy").exists()
        and np.array_equal(np.load(folder / "sgd-plain.npy"), np.load(folder / "sgd.npy"))
    )  # fmt: skip
    where = next((line.strip("# ") for line in resumed.stdout.splitlines()
                  if "resumed at" in line), "not resumed")  # fmt: skip
    accuracy = "?"
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError):
        rows = json.loads((folder / "sgd.json").read_text())["results"]["epochs"]  # per epoch
        accuracy = f"{rows[-1]['test_accuracy']:.3f}"
    figure = (f"killed (exit {killed.returncode}), {where}; test accuracy {accuracy}, "
              f"model {'bitwise equal to' if same else 'DIFFERS from'} the "
              f"uninterrupted run")  # fmt: skip
    return same, figure


def _sgd(comm: Any, folder: Path) -> Step:
    from ..runtime.comm import idle_barrier

    start = time.perf_counter()
    outcome = _sgd_jobs(folder) if comm.Get_rank() == 0 else None
    idle_barrier(comm)
    ok, figure = comm.bcast(outcome, root=0)
    return Step("SGD killed + resumed", ok, figure, time.perf_counter() - start,
                ["sgd.json", "sgd.png", "sgd.log"])  # fmt: skip


def _cfr(comm: Any, folder: Path, layout: str | None) -> Step:
    start = time.perf_counter()
    out = folder / "cfr.json"
    argv = ["cfr", "--game", "leduc_poker", "--algorithm", "dcfr", "--iterations", "2000",
            "--eval-every", "100", "--target-exploitability", "0.002",
            "--out", str(out)]  # fmt: skip
    status = _in_process(comm, argv + (["--layout", layout] if layout else []), folder / "cfr.log")
    gap = _result(comm, out, "exploitability")
    ok = status == 0 and gap is not None and gap < 0.002
    iterations = _result(comm, out, "iterations")
    figure = (
        f"Leduc, DCFR: exploitability {gap:.2e} after {iterations} iterations"
        if ok
        else (f"exit status {status}, exploitability {gap}")
    )
    return Step("CFR on Leduc poker", ok, figure, time.perf_counter() - start,
                ["cfr.json", "cfr.png", "cfr.log"])  # fmt: skip


def _graph(comm: Any, folder: Path, layout: str | None) -> Step:
    start = time.perf_counter()
    out = folder / "graph.json"
    argv = ["graph", "bfs", "--scale", "14", "--roots", "8", "--partition", "hier",
            "--out", str(out)]  # fmt: skip
    status = _in_process(comm, argv + (["--layout", layout] if layout else []),
                         folder / "graph.log")  # fmt: skip
    teps = _result(comm, out, "bfs_harmonic_mean_teps")
    ok = status == 0 and teps is not None
    figure = (f"SCALE 14, hier partition, 8 keys validated: {teps / 1e6:.1f} MTEPS "
              "(harmonic mean)") if ok else "failed"  # fmt: skip
    return Step("Graph500 BFS", ok, figure, time.perf_counter() - start,
                ["graph.json", "graph.log"])  # fmt: skip


def _sat(comm: Any, folder: Path) -> Step:
    from ..apps.sat import random_ksat, write_dimacs

    start = time.perf_counter()
    path = folder / "sat.cnf"
    if comm.Get_rank() == 0:
        cnf, _ = random_ksat(3000, 12600, 3, seed=7, planted=True)
        write_dimacs(cnf, path)
    comm.Barrier()
    argv = ["sat", "solve", str(path), "--portfolio", "--timeout", "60", "--seed", "3"]
    status = _in_process(comm, argv, folder / "sat.log")
    ok = status == 10  # SATISFIABLE, model checked against the formula before printing
    text = (folder / "sat.log").read_text() if comm.Get_rank() == 0 else ""
    winner = next((line[2:].split(";")[0].strip() for line in text.splitlines()
                   if line.startswith("c solved by")), "")  # fmt: skip
    found = f"3000 variables, 12600 clauses: SATISFIABLE{'; ' + winner if winner else ''}"
    figure = comm.bcast(found if ok else f"exit status {status}", root=0)
    return Step("SAT portfolio", ok, figure, time.perf_counter() - start,
                ["sat.cnf", "sat.log"])  # fmt: skip


def _result(comm: Any, path: Path, key: str) -> Any:
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
    for run in (lambda: _explain(comm, h, folder, say), lambda: _sgd(comm, folder),
                lambda: _cfr(comm, folder, h.layout), lambda: _graph(comm, folder, h.layout),
                lambda: _sat(comm, folder)):  # fmt: skip
        step = run()
        present = [f for f in step.files if (folder / f).exists()] if comm.Get_rank() == 0 else None
        step.files = comm.bcast(present, root=0)  # plots only where matplotlib is installed
        say(f"  {'ok    ' if step.ok else 'FAILED'}  {step.name}: {step.figure} "
            f"({step.seconds:.1f} s)", flush=True)  # fmt: skip
        steps.append(step)
    say(f"\n{'step':<22} {'result':<7} {'seconds':>8}  files (in {folder})")
    for s in steps:
        say(f"{s.name:<22} {'ok' if s.ok else 'FAILED':<7} {s.seconds:8.1f}  {', '.join(s.files)}")
    if comm.Get_rank() == 0:
        doc = [{"step": s.name, "ok": s.ok, "figure": s.figure, "seconds": s.seconds,
                "files": s.files} for s in steps]  # fmt: skip
        (folder / "tour.json").write_text(json.dumps(doc, indent=2) + "\n")
    return steps
