"""Start an MPI job: the ``mpiexec`` of the MPI that mpi4py loads, or ``srun`` in Slurm.

Pure planning (``plan_launch``) is kept apart from running (``run_job``) so tests can
check the exact command line and environment without starting anything.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .errors import LaunchError
from .layout import format_ranks, node_assignment
from .runtime import settings
from .runtime.env import usable_cores
from .runtime.exits import EARLY_EXIT, Departures, ended, faults, lost_nodes, unfinished
from .runtime.exits import ENV as EXIT_ENV
from .runtime.mpiinfo import MPIInstallation, find_mpi

__all__ = [
    "LaunchPlan",
    "plan_launch",
    "rank_command",
    "run_job",
    "start_job",
    "Attempt",
    "oversubscription_env",
    "detached_env",
    "TIMEOUT_EXIT",
]


def detached_env(**extra: str) -> dict[str, str]:
    """This environment minus what ties a process to the running MPI job or Slurm step.

    A job started from inside a rank (a peer program, a sub-job) with these variables
    would try to join the running job; without them its launcher starts it afresh, on
    this host.
    """
    prefixes = ("PMI_", "PMIX_", "HYDRA_", "MPIR_CVAR_CH4_ROOTS", "OMPI_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(extra)
    return env


TIMEOUT_EXIT = 124  # what timeout(1) returns, so scripts can tell a time-out apart

_PYTHON_NAMES = ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}")


@dataclass
class LaunchPlan:
    """A job ready to start.

    Attributes:
        argv: The full command line (launcher, its options, the rank command).
        env: Variables added to the launcher's environment.
        launcher: ``"mpiexec"`` or ``"srun"``.
        notes: Why each default was chosen, for ``--dry-run`` and logs.
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    launcher: str = "mpiexec"
    notes: list[str] = field(default_factory=list)
    ranks: int = 0  # 0: not known to the plan


@dataclass
class Attempt:
    """One start of a job: how it ended and when (``time.monotonic`` seconds).

    Attributes:
        status: The job's exit status, as ``run_job`` returns it.
        started: When its MPI launcher was started.
        ended: When its MPI launcher had ended.
        ready: When the last of its ranks was up (Python and MPI initialised, hpcpar's
            communicator in use); ``None`` if not every rank got there.
        failed_at: When the first rank ended, for a job whose ranks left early.
        failed: The ranks whose failure ended the job (those seen ending first, or
            that died of a fatal signal).
        why: One sentence on how it ended, for a job that failed.
        interrupted: Ended by ``--timeout`` or by a signal to the launcher.
        lost_nodes: The (virtual) nodes lost with their processes and storage.
    """

    status: int
    started: float
    ended: float
    ready: float | None = None
    failed_at: float | None = None
    failed: list[int] = field(default_factory=list)
    why: str = ""
    interrupted: bool = False
    lost_nodes: list[int] = field(default_factory=list)


def oversubscription_env(vendor: str, ranks: int, cores: int) -> dict[str, str]:
    """Environment that keeps an oversubscribed job from spinning ranks against each other.

    Busy-polling ranks that outnumber the cores steal time from the rank that holds
    the data everyone waits for; these settings make idle ranks yield instead.
    Open MPI also refuses to oversubscribe (and to run as root) without being told.
    """
    env: dict[str, str] = {}
    if vendor == "mpich" and ranks > cores:
        env["MPIR_CVAR_CH4_PROGRESS_THROTTLE"] = "true"
        env["MPIR_CVAR_POLLS_BEFORE_YIELD"] = "1"
    if vendor == "openmpi":
        if ranks > cores:
            env["OMPI_MCA_mpi_yield_when_idle"] = "1"
            env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
            env["PRTE_MCA_rmaps_default_mapping_policy"] = ":oversubscribe"
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
            env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    if vendor == "intel" and ranks > cores:
        env["I_MPI_WAIT_MODE"] = "1"
    return env


def rank_command(
    command: Sequence[str], known_commands: Collection[str], intercept: bool = False
) -> list[str]:
    """What every rank runs: an hpcpar subcommand, a script under the abort runner, a program.

    ``intercept``: run a Python program under ``python -m hpcpar.intercept`` (its mpi4py
    buffer collectives go through hpcpar).

    Raises:
        LaunchError: nothing to run, a missing script, an unknown program, or
            ``intercept`` with something that is not a Python program.
    """
    if not command:
        raise LaunchError(
            "launch: nothing to run; give a command after --, e.g. 'hpcpar launch -n 4 -- demo'"
        )
    head, rest = command[0], list(command[1:])
    if intercept:
        return _intercepted(head, rest)
    if head in known_commands:
        return [sys.executable, "-m", "hpcpar", head, *rest]
    if head.endswith(".py"):
        if not os.path.isfile(head):
            raise LaunchError(f"launch: script not found: {head}")
        return [sys.executable, "-m", "hpcpar.run", head, *rest]
    if head in _PYTHON_NAMES:
        return [sys.executable, *rest]
    if shutil.which(head) is None:
        raise LaunchError(f"launch: command not found: {head}")
    return [head, *rest]


def _intercepted(head: str, rest: list[str]) -> list[str]:
    runner = [sys.executable, "-m", "hpcpar.intercept"]
    if head.endswith(".py"):
        if not os.path.isfile(head):
            raise LaunchError(f"launch: script not found: {head}")
        return [*runner, head, *rest]
    if head in _PYTHON_NAMES and rest and (rest[0] in ("-m", "-c") or rest[0].endswith(".py")):
        return [*runner, *rest]
    raise LaunchError(
        "launch: --intercept runs a Python program: give script.py, python -m MODULE "
        f"or python -c CODE after --, not {head!r}"
    )


RANKS_PER_CORE = 8  # mpiexec on this host: more ranks per core only with oversubscribe


def plan_launch(
    ranks: int,
    command: Sequence[str],
    *,
    layout: str | None = None,
    launcher: str = "auto",
    known_commands: Collection[str] = (),
    environ: Mapping[str, str] | None = None,
    mpi: MPIInstallation | None = None,
    cores: int | None = None,
    oversubscribe: bool = False,
    intercept: bool = False,
) -> LaunchPlan:
    """Work out how to start ``command`` on ``ranks`` ranks.

    Args:
        ranks: Number of ranks (at least 1).
        command: An hpcpar subcommand and its arguments, a ``script.py`` and its
            arguments, or any executable.
        layout: Virtual node layout passed to the ranks as ``HPCPAR_LAYOUT``.
        launcher: ``"auto"`` (srun inside a Slurm allocation, else mpiexec),
            ``"mpiexec"`` or ``"srun"``.
        known_commands: Names treated as hpcpar subcommands.
        environ: The environment to decide from (``os.environ`` by default).
        mpi: The MPI installation (found with ``find_mpi`` by default).
        cores: Cores available (this process's affinity by default).
        oversubscribe: Allow mpiexec more than ``RANKS_PER_CORE`` ranks per core here.
        intercept: Run a Python program with its mpi4py collectives through hpcpar.

    Returns:
        The plan.

    Raises:
        LaunchError: bad rank count (far more ranks than this host's cores, unless
            ``oversubscribe``), missing script or command, no launcher found.
    """
    environ = os.environ if environ is None else environ
    if ranks < 1:
        raise LaunchError(f"launch: -n must be at least 1, not {ranks}")
    if layout:
        node_assignment(layout, ranks)  # a bad layout fails here, before any rank starts
    rank_argv = rank_command(command, known_commands, intercept)
    mpi = mpi or find_mpi()
    cores = cores or usable_cores()
    if launcher == "auto":
        in_slurm = "SLURM_JOB_ID" in environ and shutil.which("srun") is not None
        launcher = "srun" if in_slurm else "mpiexec"
    env = oversubscription_env(mpi.vendor, ranks, cores)
    notes = [f"MPI library: {mpi.version}"]
    if env:
        notes.append(f"{ranks} ranks on {cores} core(s): set {', '.join(sorted(env))}")
    if mpi.vendor == "mpich" and _ERROR_STACK not in environ:
        # a fatal MPI error is one line (what failed and why), not a page of call stack
        env[_ERROR_STACK] = "0"
    if layout:
        env["HPCPAR_LAYOUT"] = layout
    if launcher == "srun":
        pmi = settings.value("HPCPAR_SRUN_MPI", environ) or (
            "pmix" if mpi.vendor == "openmpi" else "pmi2"
        )
        argv = ["srun", f"--ntasks={ranks}", f"--mpi={pmi}", "--kill-on-bad-exit=1", *rank_argv]
        notes.append("inside a Slurm allocation: using srun")
    elif launcher == "mpiexec":
        if mpi.mpiexec is None:
            raise LaunchError(
                "launch: no mpiexec found for the MPI library mpi4py loads; set HPCPAR_MPIEXEC"
            )
        if ranks > RANKS_PER_CORE * cores and not oversubscribe:
            raise LaunchError(
                f"launch: -n {ranks} is more than {RANKS_PER_CORE} ranks per core on the "
                f"{cores} core(s) here; pass --oversubscribe if you mean it"
            )
        argv = [mpi.mpiexec, "-n", str(ranks), *rank_argv]
        notes.append(f"mpiexec: {mpi.mpiexec} ({mpi.mpiexec_source})")
    else:
        raise LaunchError(f"launch: unknown launcher {launcher!r}; choose auto, mpiexec or srun")
    return LaunchPlan(argv, env, launcher, notes, ranks)


_PR_SET_PDEATHSIG = 1
_ERROR_STACK = "MPIR_CVAR_PRINT_ERROR_STACK"


def _ends_with_launcher() -> Callable[[], None] | None:
    """A pre-exec hook that SIGKILLs the MPI launcher's process when this launcher dies.

    However the launcher ends (SIGKILL included), mpiexec then goes, and with it its
    proxies and every rank: no orphaned proxy keeps starting ranks. Linux only (None
    elsewhere). libc is loaded here, in the parent, so the hook imports nothing.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None).prctl
    return lambda: prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _end_strays(marker: bytes) -> list[int]:
    """Kill the processes of an ended job that outlived it; their ids.

    Every process of a job inherits ``marker`` (its exit-record folder) in its
    environment, also those outside the job's process group: MPI proxies started in
    other sessions, such as the virtual cluster's, whose ranks would otherwise spin on.
    """
    found = []
    for entry in Path("/proc").iterdir() if sys.platform.startswith("linux") else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue  # gone, or not ours to read
    return found


def _kill_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


_SHM = Path("/dev/shm")
_SHM_PREFIX = "mpich_shm_"


def _shm_segments() -> set[str]:
    try:
        return {n for n in os.listdir(_SHM) if n.startswith(_SHM_PREFIX)}
    except OSError:
        return set()


def _remove_orphan_segments(before: set[str]) -> list[str]:
    """Unlink the MPICH shared-memory files the job made and left behind.

    An aborted or killed job never unlinks them; these are the ones new since it
    started that no live process maps.
    """
    new = _shm_segments() - before
    if not new:
        return []
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone, or not ours to read: keep every file it might map
            continue
        mapped.update(n for n in new if n in text)
    removed = []
    for name in sorted(new - mapped):
        try:
            (_SHM / name).unlink()
            removed.append(name)
        except OSError:
            pass
    return removed


# What the MPI launcher returns when it only killed or lost ranks: 0 (it saw a rank
# leave with 0), or a signal's number or 128 + it (its own kill, or a rank's crash).
_KILLED = (0, 6, 9, 11, 15, 128 + 6, 128 + 9, 128 + 11, 128 + 15)
# MPICH ends a rank whose MPI call failed fatally with 128 + the error class, and a
# message longer than its receive buffer (class 14, MPI_ERR_TRUNCATE) is fatal inside
# the library's blocking collectives, whatever the communicator's error handler says.
_LIBRARY_TRUNCATE = 128 + 14
# MPICH's line for it: the MPI launcher's status may instead be that of a rank it then
# killed, so the job's error output is read for it too
_TRUNCATE_LINE = b"Message truncated"
MISMATCH_EXIT = 1  # the status of an uncaught CollectiveMismatchError, whoever found it


def run_job(plan: LaunchPlan, timeout: float | None = None) -> int:
    """Run a planned job and return its exit status (``start_job``'s, reported)."""
    return start_job(plan, timeout).status


def start_job(
    plan: LaunchPlan,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    then: str | None = None,
) -> Attempt:
    """Run a planned job once; how it ended.

    The job runs in its own process group; when ``timeout`` seconds pass, or the
    launcher gets SIGINT/SIGTERM, the whole group is killed. A time-out returns 124.
    A job where some rank left without finishing (``os._exit``, a signal, a crash) and
    that ends with status 0, or with the signal the MPI launcher then sends the other
    ranks, is reported naming the rank that left first (and how, for a fatal signal)
    apart from the ranks then killed; it returns ``EARLY_EXIT`` (``runtime.exits``). A
    job that a rank ended on purpose (the watchdog) returns the status that rank gave.
    A job the MPI library ended for a truncated message (its status, or its line in
    the job's error output, which passes through the launcher) is a collective called
    with different counts: reported as such, status ``MISMATCH_EXIT``. ``env``: more
    variables for this start; ``then``: what those reports say follows, in place of
    the exit status (a restart).
    """
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hpcpar-exits-") as exits:
        folder = Path(exits)
        with Departures(folder) as departures:
            try:
                status, truncated, interrupted = _run(
                    plan, timeout, {**os.environ, **plan.env, **(env or {}), EXIT_ENV: exits}
                )
            finally:
                _end_strays(f"{EXIT_ENV}={exits}".encode())
        ended_at = time.monotonic()
        gone = unfinished(folder)
        chosen = sorted(set(ended(folder).values()))
        crashed = faults(folder)
        first = departures.first(gone)
        hello = departures.hello
        lost = lost_nodes(folder)
    up = len(hello) >= plan.ranks > 0 or (plan.ranks == 0 and bool(hello))
    attempt = Attempt(
        status,
        started,
        ended_at,
        ready=max(hello.values()) if up else None,
        interrupted=interrupted,
        lost_nodes=lost,
    )
    culprits = sorted(crashed) or first
    then = None if interrupted else then
    if gone:
        attempt.failed = culprits or gone
        attempt.failed_at = min(
            (departures.when[r] for r in gone if r in departures.when), default=None
        )
    if chosen and status in (*_KILLED, *chosen):
        # a rank ended the job on purpose (the watchdog): the MPI launcher's status is
        # that of whichever rank it saw end first, or of its kill of the rest
        attempt.status = chosen[0]
        attempt.why = f"a rank ended the job with status {chosen[0]} (the watchdog)"
    elif gone and (status == _LIBRARY_TRUNCATE or (truncated and status in _KILLED)):
        who = f"rank(s) {format_ranks(first or gone)}"
        attempt.why = f"CollectiveMismatchError on {who}"
        sys.stderr.write(
            f"hpcpar launch: CollectiveMismatchError on {who}: a message from another rank "
            f"was longer than this rank expected, and the MPI library ended the job: the "
            f"ranks passed different counts or dtypes to a collective; HPCPAR_CHECK=1 names "
            f"them. {then or f'Exit status {MISMATCH_EXIT}'}\n"
        )
        attempt.status = MISMATCH_EXIT
    elif gone and (status in _KILLED or crashed):
        attempt.why = _who_left(gone, first, crashed)
        if lost:
            attempt.why = f"node(s) {format_ranks(lost)} lost; {attempt.why}"
        sys.stderr.write(f"hpcpar launch: {attempt.why}. {then or f'Exit status {EARLY_EXIT}'}\n")
        attempt.status = EARLY_EXIT
    elif status == TIMEOUT_EXIT and interrupted:
        attempt.why = f"the job ran past --timeout {timeout:g} s"
    elif status != 0:
        attempt.why = f"the job ended with status {status}"
    return attempt


def _who_left(gone: list[int], first: list[int], crashed: dict[int, str]) -> str:
    """One sentence: the rank(s) that failed, how, and the ranks ended after them.

    Ranks that died of a fatal signal failed; otherwise those seen ending first.
    """
    culprits = sorted(crashed) or first
    if not culprits:
        return (
            f"rank(s) {format_ranks(gone)} left the job without finishing (os._exit, a "
            f"signal or a crash) while it ran; the other ranks may not have finished "
            f"their work"
        )
    quiet = "os._exit or a signal"
    if len(culprits) == 1:
        how = crashed.get(culprits[0], quiet)
    else:
        how = "; ".join(f"rank {r}: {crashed.get(r, quiet)}" for r in culprits)
    rest = [r for r in gone if r not in culprits]
    after = f"; the MPI launcher then ended rank(s) {format_ranks(rest)}" if rest else ""
    return f"rank(s) {format_ranks(culprits)} left the job without finishing ({how}){after}"


class _ErrorOutput(threading.Thread):
    """Pass a job's error output on to this process's, noting MPICH's truncation line."""

    def __init__(self, pipe: IO[bytes]) -> None:
        super().__init__(name="hpcpar-launch-stderr", daemon=True)
        self.pipe = pipe
        self.truncated = False

    def run(self) -> None:
        tail = b""
        while chunk := os.read(self.pipe.fileno(), 65536):
            view = memoryview(chunk)
            while view:
                view = view[os.write(2, view) :]
            self.truncated = self.truncated or _TRUNCATE_LINE in tail + chunk
            tail = chunk[-len(_TRUNCATE_LINE) :]
        self.pipe.close()


def _run(plan: LaunchPlan, timeout: float | None, env: dict[str, str]) -> tuple[int, bool, bool]:
    """The job's status, its error output's truncation line, whether it was stopped.

    Stopped: by ``timeout``, or by a signal to this process. The truncation line is
    MPICH's, for a message longer than its receive buffer.
    """
    shm_before = _shm_segments()
    # the pre-exec hook makes one system call (prctl) and takes no lock: safe with threads
    proc = subprocess.Popen(
        plan.argv,
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_ends_with_launcher(),  # noqa: PLW1509
    )
    errors = _ErrorOutput(proc.stderr)
    errors.start()
    stopped: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        stopped.append(signum)
        _kill_group(proc, grace=2.0)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                status = proc.wait(timeout=remaining)
                errors.join(timeout=5.0)  # the rest of its output (a stray may hold it open)
                return status, errors.truncated, bool(stopped)
            except subprocess.TimeoutExpired:
                sys.stderr.write(
                    f"hpcpar launch: the job ran past --timeout {timeout:g} s; killing it\n"
                )
                _kill_group(proc)
                return TIMEOUT_EXIT, False, True
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            _kill_group(proc)
        _remove_orphan_segments(shm_before)
