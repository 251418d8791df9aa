#!/usr/bin/env python3
"""Set up hpcpar in ./.venv and run the demo or the whole test suite.

    python3 dev.py demo          # set up, then run 'hpcpar demo' on 4 ranks
    python3 dev.py test          # set up, lint, then every test serially and at 2, 3, 4 ranks
    python3 dev.py test --quick  # set up, lint, then the fast tests serially and at 2 ranks

Arguments after ``test`` (and ``--quick``) go to every pytest run.

Set-up is idempotent: it is skipped while setup.cfg and pyproject.toml are unchanged.
Only the standard library is used here, so a fresh machine with Python and pip suffices.

Each step runs in a process group of its own. SIGINT, SIGTERM and SIGHUP are passed on
to it (pytest then tears its fixtures down: Slurm daemons, virtual clusters); a step
that dies, however it dies, leaves nothing behind: on Linux this process adopts the
step's orphans (daemons, MPI launchers) and ends them, and removes any virtual-cluster
namespace the step left. Hangs are caught per test (pytest-timeout, the watchdog); no
limit is put on a whole run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
DEMO_EXTRAS = "demo"  # setup.cfg's [demo]: everything 'hpcpar demo' needs beyond the core
TEST_EXTRAS = "test"
RANKS_UNDER_MPI = (2, 3, 4)
WORKERS = 2  # tests run this many at a time (pytest-xdist), but those marked "alone"
STOP_GRACE_S = 60.0  # after a forwarded signal, how long a step may tear down
VCLUSTER_PREFIX = "hpv-"  # the virtual cluster's namespaces (hpcpar.vcluster.netns)


def _say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def bin_dir(venv: Path = VENV) -> Path:
    """The folder of a venv's executables."""
    return venv / ("Scripts" if os.name == "nt" else "bin")


# ---- process supervision (Linux: prctl; elsewhere signals are forwarded only) ----

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    with contextlib.suppress(OSError):
        return ctypes.CDLL(None, use_errno=True)
    return None


_LIBC = _libc()
_reaping = False  # set by adopt_orphans(): this process adopts and ends its steps' orphans


def _end_with_parent() -> None:
    """In a step's process, between fork and exec: SIGTERM it when this process dies."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _children(zombies: bool = False) -> list[int]:
    """This process's children, orphans it adopted included.

    The living ones, or with ``zombies`` the ended ones not yet collected.
    """
    mine, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[1]) == mine and (fields[0] == "Z") == zombies:
            found.append(int(entry.name))
    return found


def _collect_zombies(keep: int = 0) -> None:
    """Collect the adopted orphans that ended (never ``keep``: the step, whose status counts)."""
    for pid in _children(zombies=True):
        if pid != keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _end_leftovers() -> None:
    """End every process the step left (adopted orphans: daemons, MPI launchers)."""
    for _ in range(10):  # an ended daemon's own children are adopted in turn
        _collect_zombies()
        left = _children()
        if not left:
            return
        _say(f"ending {len(left)} process(es) the step left running: {left}")
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _children():
                _collect_zombies()
                time.sleep(0.1)
            if not _children():
                break


def _namespaces() -> set[str]:
    if shutil.which("ip") is None:
        return set()
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}


def _remove_namespaces(before: set[str]) -> None:
    """Take down a virtual cluster that the step brought up and left (none was up before)."""
    if any(n.startswith(VCLUSTER_PREFIX) for n in before):
        return
    if any(n.startswith(VCLUSTER_PREFIX) for n in _namespaces()):
        _say("taking down the virtual cluster the step left up")
        hpcpar = bin_dir() / "hpcpar"
        if hpcpar.exists():
            subprocess.run([str(hpcpar), "vcluster", "down"], check=False)


def supervise(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run ``argv`` in a group of its own; its exit status, or 128+N after signal N.

    Signals to this process go to the step's group; after ``STOP_GRACE_S`` the group is
    killed. Run from ``main`` (the process adopts orphans), whatever the step left
    running, or left up, is ended afterwards.
    """
    netns_before = _namespaces() if _reaping else set()
    # the pre-exec hook makes one system call (prctl) and takes no lock: safe with threads
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        preexec_fn=_end_with_parent,  # noqa: PLW1509
    )
    stopped: list[tuple[int, float]] = []

    def forward(signum: int, _frame: object) -> None:
        stopped.append((signum, time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in stops}
    try:
        while True:
            try:
                code = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if _reaping:
                    _collect_zombies(keep=proc.pid)
                if stopped and time.monotonic() - stopped[0][1] > STOP_GRACE_S:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the step's group, if any of it is left
        if _reaping:
            _end_leftovers()
            _remove_namespaces(netns_before)
    return 128 + int(stopped[0][0]) if stopped else code


def _run(*cmd: str | Path, env: dict[str, str] | None = None) -> None:
    argv = [str(c) for c in cmd]
    _say(" ".join(argv))
    # Every rank of every job imports hpcpar and pytest rewrites every test module in
    # every process: with bytecode caches they compile once, not once per process.
    env = dict(os.environ if env is None else env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    code = supervise(argv, env)
    if code != 0:
        _say(f"failed with exit status {code}: {' '.join(argv)}")
        sys.exit(code)


# ---- set-up ----


def _fingerprint(extras: str) -> str:
    digest = hashlib.sha256(extras.encode())
    for name in ("setup.cfg", "pyproject.toml"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def setup(extras: str, venv: Path = VENV) -> None:
    """Create ``venv`` and install hpcpar (editable) with ``extras``, unless already done."""
    want = _fingerprint(extras)
    py, stamp = bin_dir(venv) / "python", venv / ".hpcpar-setup"
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return
    if not py.exists():
        _run(sys.executable, "-m", "venv", venv)
    _run(py, "-m", "pip", "install", "--quiet", "--upgrade", "pip", "setuptools>=64", "wheel")
    _run(py, "-m", "pip", "install", "--quiet", "-e", f".[{extras}]" if extras else ".")
    stamp.write_text(want + "\n")


# ---- the two commands ----


def demo_argv(venv: Path = VENV, *demo_args: str) -> list[str]:
    """The demo's command line: 'hpcpar demo' on 4 ranks over two virtual nodes."""
    hpcpar = str(bin_dir(venv) / "hpcpar")
    return [
        hpcpar,
        "launch",
        "-n",
        "4",
        "--layout",
        "ppn:2",
        "--timeout",
        "600",
        "--",
        "demo",
        *demo_args,
    ]


def demo() -> None:
    """Set up .venv with what the demo uses ([demo]) and run the main job."""
    setup(DEMO_EXTRAS)
    _run(*demo_argv())


def ensure_slurm() -> None:
    """Install Debian's slurm-wlm and munge for the Slurm tests when they are missing.

    Only as root where apt-get exists; on failure the Slurm tests skip with a reason.
    """
    sbin = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    if all(shutil.which(d, path=sbin) for d in ("slurmctld", "slurmd", "munged", "sbatch")):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        _say(
            "Slurm is missing and cannot be installed here (needs root and apt-get): "
            "the Slurm tests will skip"
        )
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge"]
    for attempt in (install, ["apt-get", "update", "-q"], install):
        _say("$ " + " ".join(attempt))
        try:
            done = subprocess.run(
                attempt, env=env, timeout=900, check=False, stdout=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _say(f"{attempt[1]} failed ({exc}): the Slurm tests will skip")
            return
        if attempt is install and done.returncode == 0:
            return
    _say("installing slurm-wlm and munge failed: the Slurm tests will skip")


def test(pytest_args: list[str], quick: bool = False) -> None:
    """Lint, then run every test (MPI tests at one rank), then the MPI tests at 2, 3, 4 ranks.

    Tests run ``WORKERS`` at a time, the whole-job ones (marked ``slow``) among the
    others; then, one at a time, those marked ``alone``
    (machine-wide state such as Slurm and the virtual cluster, or timing across
    namespaces). ``quick``: only the tests not marked ``slow``, and the MPI ones at 2
    ranks, for the edit-test loop; CI runs everything, the demo in its own environment
    included.
    """
    setup(TEST_EXTRAS)
    if not quick:
        ensure_slurm()
    started = time.monotonic()
    py, hpcpar = bin_dir() / "python", bin_dir() / "hpcpar"
    _run(py, "-m", "ruff", "check", ".")
    _run(py, "-m", "ruff", "format", "--check", ".")
    under_mpi = "mpi and not slow" if quick else "mpi"
    tally = tempfile.mkdtemp(prefix="hpcpar-reliability-")  # each session's figures
    env = dict(os.environ, HPCPAR_RELIABILITY_DIR=tally)
    workers = ["-n", str(WORKERS), "--dist", "loadgroup"] if WORKERS > 1 else []
    pytest = [py, "-m", "pytest", "--with-mpi", "-m"]
    # one session for all but "alone": a worker that finishes its share early takes
    # the other's next test instead of waiting for the session to end
    _run(*pytest, "not slow" if quick else "not alone", *workers, *pytest_args, env=env)
    if not quick:
        _run(*pytest, "alone", *pytest_args, env=env)
    for ranks in RANKS_UNDER_MPI[:1] if quick else RANKS_UNDER_MPI:
        _run(
            hpcpar,
            "launch",
            "-n",
            str(ranks),
            "--",
            "python",
            "-m",
            "pytest",
            "--with-mpi",
            "-m",
            under_mpi,
            "-q",
            *pytest_args,
            env=env,
        )
    _say(f"all tests passed in {time.monotonic() - started:.0f} s")
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from reliability import total

    figures = total(Path(tally))
    if figures:
        _say(f"reliability, all sessions: {figures}")
    shutil.rmtree(tally, ignore_errors=True)


def adopt_orphans() -> None:
    """Become the subreaper of every step, so that nothing a step starts outlives it."""
    global _reaping
    if _LIBC is not None and _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        _reaping = True


def main() -> None:
    """Dispatch ``demo`` or ``test``."""
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    adopt_orphans()
    if sys.argv[1] == "demo":
        demo()
    else:
        quick = "--quick" in sys.argv[2:]
        test([a for a in sys.argv[2:] if a != "--quick"], quick=quick)


if __name__ == "__main__":
    main()
