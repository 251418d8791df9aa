"""``hpcpar jobs slurm|submit``: filled-in Slurm batch scripts, and submitting them.

``hpcpar jobs slurm --app APP --nodes N --ppn K [...] [-- APP ARGS]`` writes a batch
script: ``#SBATCH`` lines for the allocation, a clearly marked block of site
placeholders (modules, environment), and the app started with ``hpcpar launch`` inside
the allocation (``srun --mpi=pmi2`` by default, or the MPI library's ``mpiexec``;
``HPCPAR_LAUNCHER`` in the job's environment switches without an edit).
Without APP ARGS each app gets a short, complete run that writes its results under
``$HPCPAR_RESULTS`` (default ``results``). ``jobs/slurm/*.sbatch`` are these scripts
with their defaults. ``hpcpar jobs submit SCRIPT [--wait]`` runs ``sbatch`` and, with
``--wait``, reports the job's end: its state, exit code and log path.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..plugins import Command, register
from .common import integer, output_path, real

__all__ = ["APPS", "render_sbatch", "submit", "job_outcome", "check_time"]

# Per app: commands run once before the job (plain hpcpar), then the command run on
# every rank under ``hpcpar launch``, with its exit statuses that mean success.
APPS: dict[str, tuple[list[str], str, tuple[int, ...]]] = {
    "demo": ([], 'demo --output "$OUT/demo-$SLURM_JOB_ID.json"', (0,)),
    "cfr": (
        [],
        "cfr --game leduc_poker --algorithm cfr+ --iterations 200 "
        '--out "$OUT/cfr-$SLURM_JOB_ID.json"',
        (0,),
    ),
    "sgd": (
        [],
        "sgd --dataset digits --model mlp --mode sync --epochs 5 --batch 64 "
        '--checkpoint "$OUT/sgd-ck-$SLURM_JOB_ID" --checkpoint-every 50 '
        '--out "$OUT/sgd-$SLURM_JOB_ID.json"',
        (0,),
    ),
    "sat": (
        ['sat generate "$OUT/sat-$SLURM_JOB_ID.cnf" -n 2000 --ratio 4.2 --planted'],
        'sat solve "$OUT/sat-$SLURM_JOB_ID.cnf" --portfolio --timeout 300',
        (0, 10),  # 10: satisfiable, 0: unknown (SAT competition convention)
    ),
    "graph": (
        [],
        'graph all --scale 16 --roots 16 --partition hier --out "$OUT/graph-$SLURM_JOB_ID.json"',
        (0,),
    ),
    "bench": ([], 'bench allreduce-mpi --max-size 1MiB --output "$OUT/bench-$SLURM_JOB_ID"', (0,)),
}

_TEMPLATE = """\
#!/bin/bash
# hpcpar {app}: {nodes} node(s) x {ppn} rank(s), written by 'hpcpar jobs slurm'.
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={ppn}
#SBATCH --cpus-per-task={cpus}
#SBATCH --time={time}
#SBATCH --output={output}
#SBATCH --no-kill
{partition}
# ---- site placeholders: edit for your cluster (left commented out) ----------------
# module load python/3.11                 # PLACEHOLDER: your site's Python / MPI modules
# source /path/to/venv/bin/activate       # PLACEHOLDER: where hpcpar is installed
# ------------------------------------------------------------------------------------
# HPCPAR_RESTARTS=K: a failed step (a rank killed, a node lost: --no-kill keeps the
# allocation) starts again up to K times and resumes from its checkpoint (docs/recovery.md)
set -euo pipefail
HPCPAR=${{HPCPAR:-hpcpar}}
OUT=${{HPCPAR_RESULTS:-results}}
mkdir -p "$OUT"
{before}status=0
"$HPCPAR" launch -n "$SLURM_NTASKS" --launcher "${{HPCPAR_LAUNCHER:-{launcher}}}" \\
  --restarts "${{HPCPAR_RESTARTS:-0}}" -- {command} || status=$?
case $status in
  {ok}) echo "hpcpar {app}: finished (exit status $status)" ;;
  *) echo "hpcpar {app}: FAILED with exit status $status" >&2; exit "$status" ;;
esac
"""


_NO_PARTITION = "# #SBATCH --partition=...   # PLACEHOLDER: your partition / account"


def check_time(text: str) -> str:
    """``text`` if it is a Slurm time limit, else a ``UsageError``."""
    if not re.fullmatch(r"(\d+-)?\d{1,2}(:\d{2}){0,2}", text):
        from ..errors import UsageError

        raise UsageError(f"jobs: --time must be Slurm's [D-]HH[:MM[:SS]], not {text!r}")
    return text


def render_sbatch(
    app: str,
    nodes: int,
    ppn: int,
    *,
    cpus_per_task: int = 1,
    time_limit: str = "00:30:00",
    partition: str | None = None,
    launcher: str = "srun",
    output: str = "slurm-%x-%j.out",
    app_args: list[str] | None = None,
) -> str:
    """The text of a batch script (see the module docstring).

    Raises:
        UsageError: an unknown app or launcher, counts below 1, a malformed time.
    """
    from ..errors import UsageError

    if app not in APPS:
        raise UsageError(f"jobs: unknown app {app!r}; choose from {', '.join(APPS)}")
    if min(nodes, ppn, cpus_per_task) < 1:
        raise UsageError("jobs: --nodes, --ppn and --cpus-per-task must be at least 1")
    if launcher not in ("srun", "mpiexec"):
        raise UsageError(f"jobs: --launcher is srun or mpiexec, not {launcher!r}")
    before, command, ok = APPS[app]
    if app_args:
        before, command = [], shlex.join([app, *app_args])
    lines = "".join(f'"$HPCPAR" {b}\n' for b in before)
    part = f"#SBATCH --partition={partition}" if partition else _NO_PARTITION
    return _TEMPLATE.format(
        app=app,
        nodes=nodes,
        ppn=ppn,
        cpus=cpus_per_task,
        time=check_time(time_limit),
        output=output,
        partition=part,
        before=lines,
        launcher=launcher,
        command=command,
        ok="|".join(map(str, ok)),
        name=f"hpcpar-{app}",
    )


def submit(
    script: str | Path,
    wait: bool = False,
    timeout: float = 3600,
    sbatch_args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``sbatch`` the script; with ``wait``, poll until it ends and return its outcome.

    ``sbatch_args`` go before the script (they override its ``#SBATCH`` lines).

    Returns:
        ``job``, and with ``wait``: ``state`` (COMPLETED, FAILED, ...), ``exit_code``,
        ``log`` (the output file's path).

    Raises:
        HpcparError: sbatch missing or refusing the script, or the job outlasting
            ``timeout`` (it is cancelled).
    """
    from ..errors import HpcparError

    try:
        out = subprocess.run(
            ["sbatch", "--parsable", *(sbatch_args or []), str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
    except FileNotFoundError:
        raise HpcparError("jobs: sbatch not found (not on a Slurm machine?)") from None
    if out.returncode != 0:
        raise HpcparError(f"jobs: sbatch refused {script}: {out.stderr.strip()}")
    job = out.stdout.strip().split(";")[0]
    result: dict[str, Any] = {"job": job}
    if not wait:
        return result
    deadline = time.monotonic() + timeout
    while (outcome := job_outcome(job, env)) is None:
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], check=False, env=env)
            raise HpcparError(f"jobs: job {job} still running after {timeout:.0f} s; cancelled")
        time.sleep(0.5)
    result.update(outcome)
    return result


UNFINISHED = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED")


def job_outcome(job: str, env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """None while the job is queued or running; then its ``state``, ``exit_code``, ``log``.

    A job Slurm no longer knows (long finished, or never existed) has state ``UNKNOWN``
    and exit code -1.
    """
    info = _job_info(job, env)
    if info is None or info.get("JobState") in UNFINISHED:
        return None
    code = info.get("ExitCode", "-1:0").split(":")
    return {
        "state": info.get("JobState", "UNKNOWN"),
        "exit_code": int(code[0]),
        "log": info.get("StdOut"),
    }


def _job_info(job: str, env: dict[str, str] | None = None) -> dict[str, str] | None:
    """``scontrol show job`` as a dict.

    Empty when Slurm has forgotten the job, None when Slurm could not be asked (try
    again later).
    """
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", job],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return {} if "invalid job id" in out.stderr.lower() else None
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    slurm = sub.add_parser("slurm", help="write a filled-in batch script for an app")
    slurm.formatter_class = argparse.RawDescriptionHelpFormatter
    slurm.epilog = (
        "examples:\n"
        "  hpcpar jobs slurm --app cfr --nodes 2 --ppn 8 --output cfr.sbatch\n"
        "  hpcpar jobs slurm --app sat --nodes 4 --ppn 16 -- solve big.cnf --portfolio\n"
    )
    slurm.add_argument("--app", required=True, help=", ".join(APPS))
    slurm.add_argument("--nodes", type=integer(1, 1 << 20), default=1)
    slurm.add_argument(
        "--ppn", type=integer(1, 1 << 16), default=4, help="ranks per node (default 4)"
    )
    slurm.add_argument("--cpus-per-task", type=integer(1, 1 << 16), default=1)
    slurm.add_argument("--time", default="00:30:00", help="Slurm time limit (00:30:00)")
    slurm.add_argument("--partition", help="Slurm partition (default: a placeholder line)")
    slurm.add_argument("--launcher", default="srun", help="srun (pmi2) or mpiexec")
    slurm.add_argument("--log", default="slurm-%x-%j.out", help="Slurm output path")
    slurm.add_argument(
        "--output", type=output_path, metavar="FILE", help="write here (default: stdout)"
    )
    slurm.add_argument("app_args", nargs=argparse.REMAINDER, help="-- the app's arguments")
    submit_ = sub.add_parser("submit", help="sbatch a script; --wait reports how it ended")
    submit_.add_argument("script")
    submit_.add_argument("--wait", action="store_true", help="wait and report state and log")
    submit_.add_argument(
        "--timeout", type=real(0, above=True), default=3600, help="--wait at most (s)"
    )


def _run(comm: Any, args: argparse.Namespace) -> int:
    from ..errors import UsageError

    if args.action is None:
        raise UsageError("jobs: name an action: slurm or submit")
    if args.action == "submit":
        res = submit(args.script, wait=args.wait, timeout=args.timeout)
        if not args.wait:
            print(f"submitted job {res['job']}")
            return 0
        ok = res["state"] == "COMPLETED" and res["exit_code"] == 0
        word = "completed" if ok else f"FAILED ({res['state']}, exit code {res['exit_code']})"
        print(f"job {res['job']} {word}; log: {res['log']}")
        return 0 if ok else 1
    extra = args.app_args[1:] if args.app_args[:1] == ["--"] else args.app_args
    text = render_sbatch(
        args.app,
        args.nodes,
        args.ppn,
        cpus_per_task=args.cpus_per_task,
        time_limit=args.time,
        partition=args.partition,
        launcher=args.launcher,
        output=args.log,
        app_args=extra,
    )
    if args.output:
        Path(args.output).write_text(text)
        Path(args.output).chmod(0o755)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


register(
    Command(
        "jobs",
        "write a Slurm batch script for an app; submit one",
        _add_arguments,
        _run,
        needs_mpi=False,
    )
)
