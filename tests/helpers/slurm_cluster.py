"""A throwaway single-node Slurm for the tests: munged, slurmctld and slurmd.

Everything lives in one temporary directory: a private munge key and socket (the
machine's own munge, if any, is not touched), a generated ``slurm.conf`` on free ports
with one node of 8 CPUs (oversubscribed: the tests start more ranks than cores) and
``OverSubscribe=FORCE``, state and logs. ``stop()`` cancels every job and kills the
daemons it started. ``why_not()`` says why Slurm cannot run here (then the tests skip).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "srun")


def _sbin(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def why_not() -> str | None:
    """None if a local Slurm can be started, else the reason."""
    missing = [d for d in DAEMONS if _sbin(d) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing; 'python3 dev.py test' "
            "installs slurm-wlm and munge with apt-get when run as root)"
        )
    if os.geteuid() != 0:
        return "the local Slurm runs its daemons as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONF = """\
ClusterName=hpcpartest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.sock
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
MinJobAge=300
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class LocalSlurm:
    """See the module docstring; use as a context manager."""

    def __init__(self, folder: Path) -> None:
        self.dir = Path(folder)
        self.conf = self.dir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def _run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        argv = (_sbin(argv[0]) or argv[0], *argv[1:])
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def start(self, timeout: float = 60) -> None:
        """Start munged, slurmctld and slurmd and wait until the node is idle.

        Raises:
            RuntimeError: a daemon failed to start (the logs are named).
        """
        (self.dir / "state").mkdir(parents=True, exist_ok=True)
        (self.dir / "spool").mkdir(exist_ok=True)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        d = str(self.dir)
        files = [
            f"--socket={d}/munge.sock",
            f"--key-file={key}",
            f"--log-file={d}/munged.log",
            f"--pid-file={d}/munged.pid",
            f"--seed-file={d}/munged.seed",
        ]
        started = self._run("munged", "--force", *files)
        if started.returncode:
            raise RuntimeError(f"munged did not start: {started.stderr.strip()}")
        host = socket.gethostname()
        self.conf.write_text(
            CONF.format(host=host, dir=d, ctld_port=_free_port(), d_port=_free_port())
        )
        for daemon in ("slurmctld", "slurmd"):
            started = self._run(daemon, "-f", str(self.conf))
            if started.returncode:
                raise RuntimeError(
                    f"{daemon} did not start ({started.stderr.strip()}); see {d}/{daemon}.log"
                )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self._run("sinfo", "-h", "-o", "%t").stdout.strip()
            if state in ("idle", "mix", "alloc"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm node did not come up (state {state!r}); see {d}/*.log")

    def stop(self) -> None:
        """Cancel every job and stop the daemons (whatever started)."""
        if self.conf.exists():
            self._run("scancel", "--user", "root")
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.dir / f"{name}.pid"
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 2.0)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and _alive(pid):
                    time.sleep(0.1)
                if not _alive(pid):
                    break

    def __enter__(self) -> LocalSlurm:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
