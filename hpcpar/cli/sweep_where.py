"""Where an experiment's points run: this machine, the virtual cluster, or Slurm.

``local``: each point is ``hpcpar launch -n RANKS [--layout L] --timeout T -- COMMAND``.

``vcluster``: each point is ``hpcpar vcluster run --ppn RANKS/NODES --timeout T --
COMMAND`` on the virtual cluster of ``[vcluster] nodes`` and ``link``. The runner brings
that cluster up before the first point and down after the last (also when the sweep
fails); a cluster that is already up with the same nodes and link is used and left up.

``slurm``: each point is a batch job (its script, log and wall-clock times in the
point's folder) running ``hpcpar launch -n $SLURM_NTASKS --launcher srun`` inside an
allocation of RANKS tasks. Every pending point is submitted at once, then the runner
polls until they end. A point's status says ``submitted`` with its job id until then, so
a runner that is interrupted (or reaches ``[slurm] wait``) leaves its jobs queued and a
rerun collects them instead of submitting them again.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = ["WHERE", "check_where", "run_points"]

WHERE = ("local", "vcluster", "slurm")
TABLE_KEYS = {
    "vcluster": {"nodes", "link"},
    "slurm": {"partition", "time", "ppn", "launcher", "sbatch_args", "wait"},
}


def check_where(where: str, doc: dict[str, Any], params: dict[str, list]) -> dict[str, Any]:
    """The checked ``[vcluster]`` / ``[slurm]`` settings for a sweep run at ``where``.

    Raises:
        UsageError: an unknown place or key, values of the wrong kind, rank counts the
            virtual cluster cannot place, layouts on the virtual cluster.
    """
    if where not in WHERE:
        raise UsageError(f"experiment: where = {where!r}; valid: {', '.join(WHERE)}")
    settings: dict[str, Any] = {}
    for table, valid in TABLE_KEYS.items():
        got = doc.get(table, {})
        if not isinstance(got, dict):
            raise UsageError(f"experiment: [{table}] must be a table")
        bad = set(got) - valid
        if bad:
            raise UsageError(
                f"experiment: unknown key(s) {sorted(bad)} in [{table}]; valid: "
                f"{', '.join(sorted(valid))}"
            )
        settings[table] = dict(got)
    _check_values(settings["vcluster"], settings["slurm"])
    _check_placement(where, settings["vcluster"], params)
    return settings


def _check_values(vc: dict[str, Any], sl: dict[str, Any]) -> None:
    """Fill in defaults; refuse values of the wrong kind."""
    vc.setdefault("nodes", 2)
    if not isinstance(vc["nodes"], int) or vc["nodes"] < 1:
        raise UsageError(
            f"experiment: [vcluster] nodes must be a positive integer, not {vc['nodes']!r}"
        )
    if "link" in vc and not isinstance(vc["link"], str):
        raise UsageError('experiment: [vcluster] link is a string such as "20us,1gbit"')
    sl.setdefault("launcher", "srun")
    if sl["launcher"] not in ("srun", "mpiexec"):
        raise UsageError(f"experiment: [slurm] launcher is srun or mpiexec, not {sl['launcher']!r}")
    if "ppn" in sl and (not isinstance(sl["ppn"], int) or sl["ppn"] < 1):
        raise UsageError(f"experiment: [slurm] ppn must be a positive integer, not {sl['ppn']!r}")
    args = sl.setdefault("sbatch_args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise UsageError('experiment: [slurm] sbatch_args is a list of strings, e.g. ["--qos=x"]')
    if not isinstance(sl.setdefault("wait", 86400), (int, float)) or sl["wait"] <= 0:
        raise UsageError(f"experiment: [slurm] wait must be positive seconds, not {sl['wait']!r}")
    if "time" in sl:
        from .jobs import check_time

        check_time(str(sl["time"]))


def _check_placement(where: str, vc: dict[str, Any], params: dict[str, list]) -> None:
    """The virtual cluster places ranks evenly on its nodes and has no virtual layouts."""
    if where == "vcluster":
        uneven = [r for r in params["ranks"] if r % vc["nodes"]]
        if uneven:
            raise UsageError(
                f"experiment: ranks {uneven} do not divide over the virtual cluster's "
                f"{vc['nodes']} node(s) ([vcluster] nodes)"
            )
        if any(lay not in ("", None) for lay in params["layout"]):
            raise UsageError(
                "experiment: on the virtual cluster the nodes are real; remove layout from "
                "[sweep] (or run where = 'local' with virtual layouts)"
            )


def _hpcpar() -> str:
    return str(Path(sys.executable).with_name("hpcpar"))


def _launch_options(config: dict[str, Any], p: dict[str, Any]) -> list[str]:
    """``hpcpar launch``'s options after ``-n``: the timeout, the point's layout."""
    layout = ["--layout", str(p["layout"])] if p.get("layout") else []
    return ["--timeout", str(config["timeout"]), *layout]


def _finish(folder: Path, status: dict[str, Any]) -> dict[str, Any]:
    tmp = folder / "status.json.tmp"
    tmp.write_text(json.dumps(status, indent=1))
    tmp.replace(folder / "status.json")
    return status


Todo = list[tuple[int, dict[str, Any], Path, list[str]]]
Say = Callable[[dict[str, Any], dict[str, Any]], None]


def run_points(config: dict[str, Any], todo: Todo, done: Say) -> None:
    """Run each (index, point, folder, command words) at ``config['where']``.

    ``done(point, status)`` is called as each point ends, after its status file is written.
    """
    where = config["where"]
    if where == "slurm":
        _run_slurm(config, todo, done)
        return
    with _vcluster(config) if where == "vcluster" else nullcontext():
        for _, point, folder, command in todo:
            p = point["params"]
            if where == "vcluster":
                ppn = int(p["ranks"]) // config["vcluster"]["nodes"]
                argv = [
                    _hpcpar(),
                    "vcluster",
                    "run",
                    "--ppn",
                    str(ppn),
                    "--timeout",
                    str(config["timeout"]),
                ]
            else:
                argv = [_hpcpar(), "launch", "-n", str(p["ranks"]), *_launch_options(config, p)]
            argv += ["--", *command]
            t0 = time.time()
            with open(folder / "log.txt", "w") as log:
                code = subprocess.run(
                    argv, stdout=log, stderr=subprocess.STDOUT, check=False
                ).returncode
            done(
                point,
                _finish(
                    folder,
                    {
                        "status": "ok" if code == 0 else "failed",
                        "exit_code": code,
                        "seconds": time.time() - t0,
                        "params": p,
                        "argv": argv,
                        "where": where,
                        "log": str(folder / "log.txt"),
                    },
                ),
            )


@contextmanager
def _vcluster(config: dict[str, Any]) -> Iterator[None]:
    """The sweep's virtual cluster: brought up here (and down after) unless already up."""
    from ..vcluster.netns import ClusterSpec, cluster

    want = ClusterSpec(config["vcluster"]["nodes"], config["vcluster"].get("link"))
    with cluster(want, "experiment") as warnings:
        for warning in warnings:
            print(f"hpcpar experiment: warning: {warning}", flush=True)
        yield


_SCRIPT = """\
#!/bin/bash
# hpcpar experiment {name}, point {point}: written by 'hpcpar experiment run'.
#SBATCH --job-name=hpcpar-{name}
#SBATCH --ntasks={ranks}
#SBATCH --output={log}
#SBATCH --time={time}
{extra}
t0=$(date +%s.%N)
status=0
{launch} --launcher {launcher} -- {command} || status=$?
echo "$t0 $(date +%s.%N) $status" > {wall}
exit $status
"""


def slurm_script(
    config: dict[str, Any], point: dict[str, Any], folder: Path, command: list[str]
) -> str:
    """The batch script of one point (see the module docstring)."""
    sl, p, ranks = config["slurm"], point["params"], int(point["params"]["ranks"])
    extra = []
    if sl.get("partition"):
        extra.append(f"#SBATCH --partition={sl['partition']}")
    if sl.get("ppn"):
        extra += [
            f"#SBATCH --nodes={math.ceil(ranks / sl['ppn'])}",
            f"#SBATCH --ntasks-per-node={min(sl['ppn'], ranks)}",
        ]
    minutes = math.ceil(config["timeout"] / 60) + 2  # the launch's own timeout fires first
    options = shlex.join(_launch_options(config, p))
    launch = f'{shlex.quote(_hpcpar())} launch -n "$SLURM_NTASKS" {options}'
    return _SCRIPT.format(
        name=config["name"],
        point=point["id"],
        ranks=ranks,
        log=folder / "log.txt",
        time=sl.get("time") or f"{minutes // 60:02d}:{minutes % 60:02d}:00",
        extra="\n".join(extra),
        launch=launch,
        launcher=sl["launcher"],
        command=shlex.join(command),
        wall=shlex.quote(str(folder / "wall.txt")),
    )


def _run_slurm(config: dict[str, Any], todo: Todo, done: Say) -> None:
    from ..errors import HpcparError
    from .jobs import job_outcome, submit

    sl = config["slurm"]
    jobs: dict[str, tuple[dict[str, Any], Path, str]] = {}
    for _, point, folder, command in todo:
        status_file = folder / "status.json"
        old = json.loads(status_file.read_text()) if status_file.exists() else {}
        if old.get("status") == "submitted" and job_outcome(old["job"]) is None:
            jobs[point["id"]] = (point, folder, old["job"])  # still queued: collect it
            continue
        script = folder / "job.sbatch"
        script.write_text(slurm_script(config, point, folder, command))
        for stale in ("wall.txt", "log.txt"):
            (folder / stale).unlink(missing_ok=True)
        job = submit(script, sbatch_args=[f"--chdir={os.getcwd()}", *sl["sbatch_args"]])["job"]
        _finish(
            folder,
            {
                "status": "submitted",
                "job": job,
                "params": point["params"],
                "where": "slurm",
                "log": str(folder / "log.txt"),
            },
        )
        jobs[point["id"]] = (point, folder, job)
    deadline = time.monotonic() + float(sl["wait"])
    pause = 1.0  # grows while nothing ends (up to 30 s): a long queue is not polled hard
    while jobs:
        ended = 0
        for pid, (point, folder, job) in list(jobs.items()):
            outcome = job_outcome(job)
            if outcome is None:
                continue
            del jobs[pid]
            ended += 1
            done(point, _finish(folder, _slurm_status(point, folder, job, outcome)))
        if jobs and time.monotonic() > deadline:
            raise HpcparError(
                f"experiment: {len(jobs)} Slurm job(s) still queued or running after "
                f"{sl['wait']:.0f} s ([slurm] wait); rerun the sweep later to collect them"
            )
        if jobs:
            pause = 1.0 if ended else min(30.0, pause * 1.5)
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))


def _slurm_status(
    point: dict[str, Any], folder: Path, job: str, outcome: dict[str, Any]
) -> dict[str, Any]:
    """A finished job's status: Slurm's state and exit code, the script's own wall time."""
    try:
        t0, t1, code = (folder / "wall.txt").read_text().split()
        seconds, exit_code = float(t1) - float(t0), int(code)
    except (OSError, ValueError):
        seconds, exit_code = None, outcome["exit_code"]
    if outcome["state"] not in ("COMPLETED", "FAILED", "UNKNOWN"):
        exit_code = outcome["exit_code"] if outcome["exit_code"] else -1  # TIMEOUT, CANCELLED
    ok = exit_code == 0 and outcome["state"] in ("COMPLETED", "UNKNOWN") and seconds is not None
    return {
        "status": "ok" if ok else "failed",
        "exit_code": exit_code,
        "seconds": seconds,
        "params": point["params"],
        "where": "slurm",
        "job": job,
        "slurm_state": outcome["state"],
        "log": str(folder / "log.txt"),
    }
