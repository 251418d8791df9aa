"""A test run stopped in the middle leaves no process or network namespace behind.

The session of ``tests/helpers/teardown_session.py`` holds a local Slurm (munged,
slurmctld, slurmd), a virtual cluster and a running MPI job when it is stopped: by
SIGTERM to pytest itself (its fixtures tear down), by SIGTERM to ``dev.py``'s
supervisor (passed on to pytest), and by SIGKILL to pytest under the supervisor (no
teardown runs: the supervisor ends the orphans it adopted and removes the namespaces).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launching import clean_env

ROOT = Path(__file__).resolve().parents[2]
SESSION = ROOT / "tests" / "helpers" / "teardown_session.py"
SUPERVISED = (
    "import sys; sys.path.insert(0, sys.argv[1]); import dev; dev.adopt_orphans(); "
    "sys.exit(dev.supervise(sys.argv[2:]))"
)

pytestmark = [
    pytest.mark.slow,  # starts Slurm, a virtual cluster and MPI jobs
    pytest.mark.xdist_group("vcluster"),  # one virtual cluster on the machine at a time
    pytest.mark.alone,  # counts every process on the machine that carries its mark
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process tree"),
]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _marked(token: str) -> list[int]:
    """Processes whose environment carries ``token`` (the session's and its children's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if token.encode() in (entry / "environ").read_bytes() and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _namespaces() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in listing.stdout.splitlines() if line.startswith("hpv-")]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["sigterm-pytest", "sigterm-supervisor", "sigkill-pytest"])
def test_a_stopped_run_leaves_nothing_running(tmp_path, how):
    token = f"teardown-{os.getpid()}-{how}"
    ready = tmp_path / "ready.json"
    env = clean_env(READY_FILE=str(ready), TEARDOWN_TOKEN=token)
    pytest_argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        str(SESSION),
    ]
    argv = (
        pytest_argv
        if how == "sigterm-pytest"
        else [sys.executable, "-c", SUPERVISED, str(ROOT), *pytest_argv]
    )
    run = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not ready.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), f"the session did not get ready:\n{run.communicate()[0][-3000:]}"
        held = json.loads(ready.read_text())
        held_pids = [held["launcher"], *held["job"], *held["daemons"]]
        assert all(_alive(p) for p in held_pids)
        if how == "sigkill-pytest":
            os.kill(held["pytest"], signal.SIGKILL)
        else:
            run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=180)[0]
    finally:
        if run.poll() is None:
            run.kill()
    deadline = time.monotonic() + 30  # ended processes may take a moment to go
    while time.monotonic() < deadline and (_marked(token) or any(map(_alive, held_pids))):
        time.sleep(0.2)
    assert run.returncode != 0, output[-3000:]
    assert not [p for p in held_pids if _alive(p)], output[-3000:]
    assert not _marked(token), output[-3000:]
    if held["vcluster"]:
        assert not _namespaces(), output[-3000:]
