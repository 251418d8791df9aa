"""``hpcpar bench recovery``: from a killed rank or node to the next completed step.

Run as one process; it launches the jobs itself. Each case trains an app (``sgd`` or
``cfr``) at ``--ranks`` ranks on the virtual nodes of ``--layout``, saving every step,
and kills one rank (``process``) or every rank of the last node with its local storage
(``node``) right after step ``--kill-step`` commits. Two ways back are timed from the
same kind of run:

- ``restart``: ``hpcpar launch --restarts 1`` starts the job again at once (on the
  surviving nodes' ranks after a node loss); it restores from the node-local level (on
  ``/dev/shm`` where there is one), and the lost node's shards from their partner copies.
- ``by-hand``: the peer, what a user does today: the job ends, and the same command is
  started again at once (no queue wait counted, in the peer's favour) from the HDF5
  level on the shared file system, the only level that job writes besides memory.

The figure is the time from the kill (the commit marker of the killed step appearing)
to the first step completed after it (the next marker), polled every millisecond, and
the restart's phases from ``--restart-report``: teardown (the rest of the job ending),
start (new processes until Python and MPI are up), down (the failure to every new rank
up), and the rest (restore, reshard and one step). Every run's final model is checked
bitwise against an uninterrupted run's (sgd's parameters with ``--reproducible
--full-data``, cfr's average policy).

``--efficiency S`` measures the useful-work efficiency instead: sgd trained for about S
seconds without failures (and without checkpoints), then the same training with a
checkpoint every ``--save-every`` seconds of training (node-local, on ``/dev/shm``) and
rank 1 killed every ``--every`` seconds of each start under ``hpcpar launch
--restarts``; the efficiency is the first time over the second, and the two models must
be bitwise the same.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..cli.common import integer, real
from ..errors import UsageError
from ..plugins import Benchmark, register
from .harness import Measurement, quartile_spread

__all__: list[str] = []

_POLL = 0.001  # seconds between looks at the commit markers


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--apps", default="sgd,cfr", help="apps to train, comma-separated: sgd, cfr (both)"
    )
    parser.add_argument(
        "--failures",
        default="process,node",
        help="what is lost, comma-separated: process (one rank) and node (every rank of "
        "the last virtual node and its storage) (default both)",
    )
    parser.add_argument(
        "--ranks", type=integer(2, 64), default=4, help="ranks of the job (default 4)"
    )
    parser.add_argument(
        "--kill-step", type=integer(1), default=6, metavar="S", help="killed after step S (6)"
    )
    parser.add_argument("--no-hand", action="store_true", help="skip the by-hand peer")
    parser.add_argument(
        "--efficiency",
        type=real(1, 86400),
        default=None,
        metavar="S",
        help="instead: sgd trained for about S seconds without failures, then with one "
        "rank killed every --every seconds under launch --restarts; reports the useful-work "
        "efficiency (the failure-free time over the time with failures)",
    )
    parser.add_argument(
        "--every",
        type=real(0.5, 86400),
        default=60.0,
        metavar="S",
        help="with --efficiency: seconds a start runs before its rank is killed (default 60)",
    )
    parser.add_argument(
        "--save-every",
        type=real(0.001, 86400),
        default=1.0,
        metavar="S",
        help="with --efficiency: seconds of training between checkpoints (default 1)",
    )


def _app_command(app: str, folder: Path, steps: int) -> list[str]:
    """The app's training command, writing its results (and model) to ``folder``."""
    out = ["--out", str(folder / "out.json")]
    if app == "sgd":
        return [
            *("sgd", "--dataset", "digits", "--model", "mlp", "--hidden", "256"),
            *("--epochs", str(max(2, steps // 20 + 1)), "--batch", "96", "--lr", "0.05"),
            *("--reproducible", "--full-data", *out),
        ]
    return [
        *("cfr", "--game", "leduc_poker", "--iterations", str(steps), "--eval-every", "50"),
        *(*out, "--policy", str(folder / "policy.json")),
    ]


def _final(app: str, folder: Path) -> Any:
    """The trained model: sgd's parameters, cfr's average policy."""
    if app == "sgd":
        return np.load(folder / "out.npy")
    return json.loads((folder / "policy.json").read_text())["players"]


class _Markers(threading.Thread):
    """When each version's first commit marker appeared under ``root``."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.seen, self.stop = root, {}, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            with contextlib.suppress(OSError):
                for marker in (self.root / "commits").glob("*/v*.committed"):
                    self.seen.setdefault(int(marker.name[1:].split(".")[0]), now)
            time.sleep(_POLL)


def _launch(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcpar", "launch", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )


def _job(app: str, way: str, folder: Path, args: argparse.Namespace) -> tuple[list, Path | None]:
    """The app's command line with its checkpoints for ``way``, and its /dev/shm folder."""
    levels = "memory,local,partner" if way == "restart" else "memory,hdf5"
    shm = Path("/dev/shm")  # tmpfs: node-local copies in memory that outlive a process
    command = _app_command(app, folder, args.kill_step * 4)
    command += ["--checkpoint", str(folder / "ck"), "--checkpoint-every", "1"]
    command += ["--checkpoint-levels", levels]
    local = None
    if way == "restart" and shm.is_dir():
        local = Path(tempfile.mkdtemp(prefix="hpcpar-bench-recovery-", dir=shm))
        command += ["--checkpoint-local", str(local)]
    return command, local


def _one(app: str, failure: str, way: str, args: argparse.Namespace, work: Path) -> dict:
    """One killed run and its recovery: seconds from the kill to the next step, phases."""
    from ..launcher import detached_env
    from ..layout import node_assignment
    from ..restarts import survivors

    folder = Path(tempfile.mkdtemp(prefix=f"{app}-{failure}-{way}-", dir=work))
    ck = folder / "ck"
    last = max(node_assignment(args.layout, args.ranks))
    target = f"node={last}" if failure == "node" else "rank=1"
    fault = f"kill=after-commit,step={args.kill_step},{target}"
    command, local = _job(app, way, folder, args)
    env = detached_env(HPCPAR_PLOTS="0", HPCPAR_CHECKPOINT_FAULT=fault)
    layout = ["-n", str(args.ranks), "--layout", args.layout, "--timeout", "600"]
    report = folder / "restarts.json"
    watch = _Markers(ck)
    watch.start()
    try:
        if way == "restart":
            restart = ["--restarts", "1", "--restart-report", str(report)]
            run = _launch([*layout, *restart, "--", *command], env)
        else:
            first = _launch([*layout, "--", *command], env)
            if first.returncode == 0:
                raise UsageError(f"bench recovery: the {failure} fault did not end the job")
            if failure == "node":  # the user starts again on the nodes that are left
                ranks, left = survivors(args.layout, args.ranks, [last])
                layout = ["-n", str(ranks), "--layout", str(left), "--timeout", "600"]
            shutil.rmtree(ck / "nodes", ignore_errors=True)  # a new allocation's nodes
            run = _launch([*layout, "--", *command], {**env, "HPCPAR_CHECKPOINT_FAULT": ""})
    finally:
        watch.stop.set()
        watch.join()
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)
    if run.returncode != 0:
        raise UsageError(f"bench recovery: {app} {failure} {way} failed:\n{run.stderr[-2000:]}")
    kill, after = args.kill_step, args.kill_step + 1
    if kill not in watch.seen or after not in watch.seen:
        raise UsageError(f"bench recovery: no commit of step {kill} and {after} was seen")
    phases = {}
    if report.exists():
        said = json.loads(report.read_text())["recoveries"]
        phases = {k: said[0][k] for k in ("teardown", "start", "down")} if said else {}
    return {"seconds": watch.seen[after] - watch.seen[kill], "phases": phases, "folder": folder}


def _phases(runs: list[dict]) -> dict[str, float | None]:
    """Median teardown, start and down of the restarts, and the rest: restore and a step.

    The launcher's times and the markers' are both ``time.monotonic`` on this host.
    """
    if not all(r["phases"] for r in runs):
        return dict.fromkeys(("teardown", "start", "down", "rest"))
    out = {
        k: statistics.median(r["phases"][k] for r in runs) for k in ("teardown", "start", "down")
    }
    out["rest"] = statistics.median(r["seconds"] - r["phases"]["down"] for r in runs)
    return out


def _reference(app: str, args: argparse.Namespace, work: Path) -> Any:
    from ..launcher import detached_env

    folder = Path(tempfile.mkdtemp(prefix=f"{app}-plain-", dir=work))
    command = _app_command(app, folder, args.kill_step * 4)
    layout = ["-n", str(args.ranks), "--layout", args.layout, "--timeout", "600"]
    run = _launch([*layout, "--", *command], detached_env(HPCPAR_PLOTS="0"))
    if run.returncode != 0:
        raise UsageError(f"bench recovery: the uninterrupted {app} run failed:\n{run.stderr}")
    return _final(app, folder)


def _same(app: str, a: Any, b: Any) -> bool:
    """Bitwise: sgd's model, cfr's average policy (both resume bitwise at any count)."""
    return bool(np.array_equal(a, b)) if app == "sgd" else a == b


def fmt(value: float | None) -> str:
    """A figure in six characters, ``-`` for none."""
    return "     -" if value is None else f"{value:6.2f}"


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, Any]:
    start = time.monotonic()
    run = _launch(argv, env)
    if run.returncode != 0:
        raise UsageError(f"bench recovery: {' '.join(argv[-12:])} failed:\n{run.stderr[-2000:]}")
    return time.monotonic() - start, run


def _efficiency(args: argparse.Namespace, work: Path) -> list[Measurement]:
    """Train sgd for about ``args.efficiency`` s failure-free, then killed every ``every`` s."""
    from ..launcher import detached_env

    layout = ["-n", str(args.ranks), "--layout", args.layout or "ppn:2"]
    env = detached_env(HPCPAR_PLOTS="0")
    probe = work / "probe"
    probe.mkdir()
    _timed([*layout, "--", *_app_command("sgd", probe, 0)], env)
    rows = json.loads((probe / "out.json").read_text())["results"]["epochs"]
    epoch = statistics.median(r["seconds"] for r in rows)  # the training, not the start
    step = epoch * 96 / statistics.median(r["samples_per_s"] * r["seconds"] for r in rows)
    epochs = max(2, round(args.efficiency / epoch))
    save = max(1, round(args.save_every / step))  # steps between checkpoints
    command = _app_command("sgd", work / "plain", 0)
    command[command.index("--epochs") + 1] = str(epochs)
    free, _ = _timed([*layout, "--", *command], env)
    kills = int(free * 1.5 / args.every) + 2
    faults = ";".join(
        f"kill=after-commit,rank=1,after={args.every:g},restart={k}" for k in range(kills)
    )
    failing = _app_command("sgd", work / "failing", 0)
    failing[failing.index("--epochs") + 1] = str(epochs)
    failing += ["--checkpoint", str(work / "failing" / "ck"), "--checkpoint-every", str(save)]
    shm = Path("/dev/shm")
    local = tempfile.mkdtemp(prefix="hpcpar-bench-recovery-", dir=shm if shm.is_dir() else work)
    failing += ["--checkpoint-local", local]
    report = work / "restarts.json"
    restarts = ["--restarts", str(kills), "--restart-report", str(report)]
    try:
        slow, _ = _timed(
            [*layout, *restarts, "--", *failing], {**env, "HPCPAR_CHECKPOINT_FAULT": faults}
        )
    finally:
        shutil.rmtree(local, ignore_errors=True)
    n = len(json.loads(report.read_text())["recoveries"])
    ok = _same("sgd", np.load(work / "plain" / "out.npy"), np.load(work / "failing" / "out.npy"))
    print(
        f"# bench recovery --efficiency: sgd, {args.ranks} ranks, layout {layout[-1]}, "
        f"{epochs} epochs, a checkpoint every {save} steps (about {args.save_every:g} s)\n"
        f"failure-free {free:.1f} s; with a rank killed every "
        f"{args.every:g} s of a start: {n} failures, {slow:.1f} s; useful-work efficiency "
        f"{free / slow:.3f}; model {'bitwise the same' if ok else 'DIFFERS'}",
        flush=True,
    )
    once = {"repeats": 1, "spread_pct": 0.0, "algbw_gbs": None, "busbw_gbs": None}
    peer = Measurement(
        0,
        "sgd-failure-free",
        free * 1e6,
        free * 1e6,
        free * 1e6,
        0,
        **once,
        vs_peer=None,
        valid=True,
    )
    return [
        peer,
        Measurement(
            0,
            "sgd-failing",
            slow * 1e6,
            slow * 1e6,
            slow * 1e6,
            n,
            **once,
            vs_peer=free / slow,
            valid=ok,
        ),
    ]


def _run(comm: Any, args: argparse.Namespace) -> list[Measurement]:
    if comm.Get_size() != 1:
        raise UsageError("bench recovery: start it as one process; it launches the jobs")
    if args.efficiency is not None:
        with tempfile.TemporaryDirectory(prefix="hpcpar-bench-recovery-") as tmp:
            return _efficiency(args, Path(tmp))
    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    failures = [f.strip() for f in args.failures.split(",") if f.strip()]
    if not apps or set(apps) - {"sgd", "cfr"}:
        raise UsageError(f"bench recovery: --apps takes sgd, cfr, not {args.apps!r}")
    if not failures or set(failures) - {"process", "node"}:
        raise UsageError(f"bench recovery: --failures takes process, node, not {args.failures!r}")
    args.layout = args.layout or "ppn:2"
    from ..layout import node_assignment

    if max(node_assignment(args.layout, args.ranks)) < 1 and "node" in failures:
        raise UsageError("bench recovery: a node loss needs a --layout of 2 or more nodes")
    ways = ["restart"] if args.no_hand else ["restart", "by-hand"]
    rows: list[Measurement] = []
    print(
        f"# bench recovery: {args.ranks} ranks, layout {args.layout}, killed after step "
        f"{args.kill_step}, {args.repeats} repeat(s); seconds from the kill to the next step"
    )
    print(
        f"{'app':5s} {'lost':8s} {'way':8s} {'median':>7s} {'iqr%':>5s} {'min':>6s} "
        f"{'max':>6s} {'vs':>6s}  {'teardown':>8s} {'start':>6s} {'down':>6s} {'rest':>6s}  "
        "same"
    )
    with tempfile.TemporaryDirectory(prefix="hpcpar-bench-recovery-") as tmp:
        work = Path(tmp)
        for app in apps:
            want = _reference(app, args, work)
            for failure in failures:
                medians: dict[str, float] = {}
                for way in ways:
                    runs = [_one(app, failure, way, args, work) for _ in range(args.repeats)]
                    times = [r["seconds"] for r in runs]
                    ok = all(_same(app, _final(app, r["folder"]), want) for r in runs)
                    med = statistics.median(times)
                    medians[way] = med
                    phase = _phases(runs)
                    vs = None if way == "restart" else med / medians["restart"]
                    spread = quartile_spread(times)
                    rows.append(
                        Measurement(
                            0,
                            f"{app}-{failure}-{way}",
                            med * 1e6,
                            min(times) * 1e6,
                            max(times) * 1e6,
                            1,
                            len(times),
                            spread,
                            None,
                            None,
                            vs,
                            ok,
                        )
                    )
                    print(
                        f"{app:5s} {failure:8s} {way:8s} {med:7.2f} {spread:5.0f} "
                        f"{min(times):6.2f} {max(times):6.2f} {fmt(vs)}  "
                        f"{fmt(phase['teardown']):>8s} "
                        f"{fmt(phase['start'])} {fmt(phase['down'])} {fmt(phase['rest'])}  "
                        f"{'yes' if ok else 'NO'}",
                        flush=True,
                    )
    return rows


register(
    Benchmark(
        "recovery",
        "from a killed rank or node to the next completed step: launch --restarts vs a "
        "restart by hand from HDF5",
        _add_arguments,
        _run,
        peer="by-hand",
    )
)
