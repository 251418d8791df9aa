#!/usr/bin/env python3
"""Set up hpcpar in ./.venv and run the demo or the whole test suite.

    python3 dev.py demo          # set up, then run 'hpcpar demo' on 4 ranks
    python3 dev.py test          # set up, lint, then every test serially and at 2, 3, 4 ranks
    python3 dev.py test --quick  # set up, lint, then the fast tests serially and at 2 ranks

Arguments after ``test`` (and ``--quick``) go to every pytest run.

Set-up is idempotent: it is skipped while setup.cfg and pyproject.toml are unchanged.
Only the standard library is used here, so a fresh machine with Python and pip suffices.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".hpcpar-setup"
RANKS_UNDER_MPI = (2, 3, 4)
JOB_TIMEOUT_S = 900  # a whole MPI pytest run; each test has its own, shorter limit


def _say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def _run(*cmd: str | Path, env: dict[str, str] | None = None, timeout: float | None = None) -> None:
    _say(" ".join(str(c) for c in cmd))
    try:
        code = subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        _say(f"timed out after {timeout:g} s: {' '.join(str(c) for c in cmd)}")
        sys.exit(124)
    if code != 0:
        _say(f"failed with exit status {code}: {' '.join(str(c) for c in cmd)}")
        sys.exit(code)


def _fingerprint(extras: str) -> str:
    digest = hashlib.sha256(extras.encode())
    for name in ("setup.cfg", "pyproject.toml"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def setup(extras: str) -> None:
    """Create .venv and install hpcpar (editable) with ``extras``, unless already done."""
    want = _fingerprint(extras)
    if PY.exists() and STAMP.exists() and STAMP.read_text().strip() == want:
        return
    if not PY.exists():
        _run(sys.executable, "-m", "venv", VENV)
    _run(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip", "setuptools>=64", "wheel")
    _run(PY, "-m", "pip", "install", "--quiet", "-e", f".[{extras}]" if extras else ".")
    STAMP.write_text(want + "\n")


def _mpi_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HPCPAR_TIMEOUT", str(JOB_TIMEOUT_S))
    return env


def demo() -> None:
    """Run the main job: 'hpcpar demo' on 4 ranks over two virtual nodes (plots need matplotlib)."""
    setup("plot")
    _run(BIN / "hpcpar", "launch", "-n", "4", "--layout", "ppn:2", "--timeout", "600", "--", "demo")


def ensure_slurm() -> None:
    """Install Debian's slurm-wlm and munge for the Slurm tests when they are missing.

    Only as root where apt-get exists; on failure the Slurm tests skip with a reason.
    """
    sbin = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    if all(shutil.which(d, path=sbin) for d in ("slurmctld", "slurmd", "munged", "sbatch")):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        _say("Slurm is missing and cannot be installed here (needs root and apt-get): "
             "the Slurm tests will skip")  # fmt: skip
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge"]
    for attempt in (install, ["apt-get", "update", "-q"], install):
        _say("$ " + " ".join(attempt))
        try:
            done = subprocess.run(attempt, env=env, timeout=900, check=False,
                                  stdout=subprocess.DEVNULL)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            _say(f"{attempt[1]} failed ({exc}): the Slurm tests will skip")
            return
        if attempt is install and done.returncode == 0:
            return
    _say("installing slurm-wlm and munge failed: the Slurm tests will skip")


def test(pytest_args: list[str], quick: bool = False) -> None:
    """Lint, then run every test serially (MPI tests at one rank) and at 2, 3 and 4 ranks.

    ``quick``: only the tests not marked ``slow`` (those that start whole jobs), serially
    and at 2 ranks, for the edit-test loop; CI runs everything.
    """
    setup("test")
    if not quick:
        ensure_slurm()
    started = time.monotonic()
    _run(PY, "-m", "ruff", "check", ".")
    _run(PY, "-m", "ruff", "format", "--check", ".")
    serial, under_mpi = (["-m", "not slow"], "mpi and not slow") if quick else ([], "mpi")
    tally = tempfile.mkdtemp(prefix="hpcpar-reliability-")  # each session's figures
    os.environ["HPCPAR_RELIABILITY_DIR"] = tally
    _run(PY, "-m", "pytest", "--with-mpi", *serial, *pytest_args, timeout=JOB_TIMEOUT_S)
    for ranks in RANKS_UNDER_MPI[:1] if quick else RANKS_UNDER_MPI:
        _run(
            BIN / "hpcpar",
            "launch",
            "-n",
            str(ranks),
            "--timeout",
            str(JOB_TIMEOUT_S),
            "--",
            "python",
            "-m",
            "pytest",
            "--with-mpi",
            "-m",
            under_mpi,
            "-q",
            *pytest_args,
            env=_mpi_env(),
        )
    _say(f"all tests passed in {time.monotonic() - started:.0f} s")
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from reliability import total

    figures = total(Path(tally))
    if figures:
        _say(f"reliability, all sessions: {figures}")
    shutil.rmtree(tally, ignore_errors=True)


def main() -> None:
    """Dispatch ``demo`` or ``test``."""
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "demo":
        demo()
    else:
        quick = "--quick" in sys.argv[2:]
        test([a for a in sys.argv[2:] if a != "--quick"], quick=quick)


if __name__ == "__main__":
    main()
