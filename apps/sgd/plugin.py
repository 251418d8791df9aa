"""The SGD app's part of hpcpar: ``hpcpar sgd``, ``hpcpar bench sgd`` and a demo step.

Named in the entry-point group ``hpcpar.plugins`` (setup.cfg); importing it registers
the command (``cli``), the benchmark (``bench``) and the tour step below.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpcpar.cli.tour import Step
from hpcpar.plugins import TourStep, register

from . import bench, cli

__all__ = ["bench", "cli", "killed_and_resumed"]


def killed_and_resumed(folder: Path) -> tuple[bool, str]:
    """Rank 0: an uninterrupted SGD job, and one killed and restarted (2 ranks each).

    A job really killed by ``SIGKILL`` after a checkpoint commit cannot be simulated
    inside the demo's own job, so these are separate jobs: the second's rank 1 is killed
    after step 60 commits, ``hpcpar launch --restarts 1`` starts it again, it resumes
    from its checkpoint, and its model must equal the uninterrupted one bit for bit.
    """
    from hpcpar.launcher import detached_env

    base = [
        sys.executable,
        "-m",
        "hpcpar",
        "launch",
        "-n",
        "2",
        "--layout",
        "ppn:1",
        "--launcher",
        "mpiexec",
        "--timeout",
        "180",
        "--restarts",
        "1",
        "--",
        "sgd",
        "--dataset",
        "digits",
        "--model",
        "mlp",
        "--hidden",
        "32",
        "--epochs",
        "8",
        "--batch",
        "64",
        "--lr",
        "0.1",
        "--mode",
        "sync",
    ]
    ck = ["--checkpoint", str(folder / "sgd-checkpoint"), "--checkpoint-every", "20"]

    def job(out: str, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, "--out", str(folder / out), *extra],
            text=True,
            capture_output=True,
            env=detached_env(**env),
            timeout=240,
            check=False,
        )

    plain = job("sgd-plain.json")
    # a checkpoint left by an earlier demo in this folder would be resumed, not killed
    shutil.rmtree(folder / "sgd-checkpoint", ignore_errors=True)
    resumed = job("sgd.json", *ck, HPCPAR_CHECKPOINT_FAULT="kill=after-commit,step=60,rank=1")
    (folder / "sgd.log").write_text(
        "\n".join(
            f"$ {name}: exit {p.returncode}\n{p.stdout}{p.stderr}"
            for name, p in (("uninterrupted", plain), ("killed and restarted", resumed))
        )
    )
    import numpy as np

    restarted = "after 1 restart(s)" in resumed.stderr
    same = (
        plain.returncode == 0
        and resumed.returncode == 0
        and restarted
        and (folder / "sgd.npy").exists()
        and np.array_equal(np.load(folder / "sgd-plain.npy"), np.load(folder / "sgd.npy"))
    )
    where = next(
        (line.strip("# ") for line in resumed.stdout.splitlines() if "resumed at" in line),
        "not resumed",
    )
    accuracy = "?"
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError):
        rows = json.loads((folder / "sgd.json").read_text())["results"]["epochs"]  # per epoch
        accuracy = f"{rows[-1]['test_accuracy']:.3f}"
    down = next(
        (line.split("down ")[-1] for line in resumed.stderr.splitlines() if "; teardown" in line),
        "?",
    )
    figure = (
        f"rank 1 killed, restarted by launch --restarts (down {down}), {where}; "
        f"test accuracy {accuracy}, "
        f"model {'bitwise equal to' if same else 'DIFFERS from'} the "
        f"uninterrupted run"
    )
    return same, figure


def _step(comm: Any, h: Any, folder: Path, say: Any) -> Step:
    """An SGD job killed after a checkpoint commit and resumed, against an uninterrupted one."""
    from hpcpar.runtime.comm import idle_barrier

    start = time.perf_counter()
    outcome = killed_and_resumed(folder) if comm.Get_rank() == 0 else None
    idle_barrier(comm)
    ok, figure = comm.bcast(outcome, root=0)
    return Step(
        "SGD killed + resumed",
        ok,
        figure,
        time.perf_counter() - start,
        ["sgd.json", "sgd.png", "sgd.log"],
    )


register(TourStep("SGD killed + resumed", 20, _step))
