"""Test harness: MPI tests written once, run at any rank count, never hanging.

Under ``mpiexec`` (more than one rank) this plugin keeps every rank's pytest in
lockstep: after each test phase the ranks agree on its outcome, so a test that fails
on one rank fails on all (rank 0 reports it with the failing ranks' tracebacks) and
the next test starts together. A rank whose test failed waits GRACE_S for the others
to finish that test; if they don't (they are blocked in a collective the failed rank
never entered) it prints its traceback and aborts the job. A test that runs past its
pytest-timeout limit prints which test and where every thread was, then aborts the
job. Only rank 0 prints pytest's report.

Outside MPI, SIGTERM and SIGHUP stop a run as Ctrl-C does: pytest then tears down
every fixture, so a stopped run leaves no Slurm daemon, virtual cluster or job behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import pytest
import reliability
import whole_jobs

from hpcpar.runtime.env import launcher_rank_size

GRACE_S = float(os.environ.get("HPCPAR_TEST_GRACE", "15"))
_RANK, _SIZE = launcher_rank_size()
_UNDER_MPI = _SIZE > 1
_PASSED, _SKIPPED, _FAILED = 0, 1, 2


_capture: Any = None  # pytest's capture manager: suspended before the job dies


def _release_stderr() -> None:
    """Give back the real stderr: output captured for a test is lost when the job aborts."""
    if _capture is not None:
        with contextlib.suppress(Exception):  # already suspended, or capture is off
            _capture.suspend_global_capture(in_=True)


def _abort(message: str) -> None:
    from mpi4py import MPI

    _release_stderr()
    sys.stderr.write(f"[{_RANK}/{_SIZE}] {message}\n")
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)


class _Lockstep:
    """Agrees test outcomes across ranks on a communicator of its own."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self.comm = MPI.COMM_WORLD.Dup()

    def agree(self, report: pytest.TestReport) -> None:
        import numpy as np

        mine = _FAILED if report.failed else _SKIPPED if report.skipped else _PASSED
        statuses = np.zeros(_SIZE, dtype=np.int64)
        request = self.comm.Iallgather(np.array([mine], dtype=np.int64), statuses)
        deadline = time.monotonic() + GRACE_S if mine == _FAILED else None
        while not request.Test():
            if deadline is not None and time.monotonic() > deadline:
                _abort(
                    f"{report.nodeid} ({report.when}) failed on this rank and the other ranks "
                    f"did not finish it within {GRACE_S:g} s (blocked in a collective?); "
                    f"aborting the job. This rank's failure:\n{report.longreprtext}"
                )
            time.sleep(0.001)
        failed = [r for r, s in enumerate(statuses) if s == _FAILED]
        skipped = [r for r, s in enumerate(statuses) if s == _SKIPPED]
        if failed:  # every rank knows it from the statuses, so every rank gathers the texts
            texts = self.comm.allgather(report.longreprtext if mine == _FAILED else "")
            # Identical failures (the usual case for a collective assertion) print once.
            own = report.longreprtext if mine == _FAILED else ""
            groups: dict[str, list[int]] = {}
            for r in failed:
                if texts[r] != own:
                    groups.setdefault(texts[r], []).append(r)
            detail = "\n".join(
                f"---- rank(s) {ranks} ----\n{text}" for text, ranks in groups.items()
            )
            report.outcome = "failed"
            report.longrepr = f"{own}\nfailed on rank(s) {failed} of {_SIZE}\n{detail}".strip()
        elif skipped and len(skipped) < _SIZE:
            report.outcome = "failed"
            report.longrepr = (
                f"skipped on rank(s) {skipped} only; an MPI test must skip on every rank or none"
            )


_lockstep: _Lockstep | None = None


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def _stop_like_ctrl_c() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, so pytest runs every fixture's teardown."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _interrupt)


@pytest.hookimpl(trylast=True)  # after the terminal reporter exists, so it can be removed
def pytest_configure(config: pytest.Config) -> None:
    global _lockstep, _capture
    config.pluginmanager.register(reliability.Plugin(_RANK), "hpcpar-reliability")
    if not _UNDER_MPI:
        _stop_like_ctrl_c()
        return
    _capture = config.pluginmanager.getplugin("capturemanager")
    _lockstep = _Lockstep()
    if _RANK != 0:
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


@pytest.hookimpl(tryfirst=True)  # before -m selects: "not slow" must see these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a whole job is slow: marked here, from its source."""
    for item in items:
        function = getattr(item, "function", None)
        if function is None or item.get_closest_marker("slow") is not None:
            continue
        path = str(item.path)
        uses = set(getattr(item, "fixturenames", ()))  # a fixture of its module may start it
        if whole_jobs.starts_a_job(path, function.__name__) or (
            uses & whole_jobs.launching_functions(path)
        ):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_unmarked_whole_jobs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A test not marked slow that starts a whole job anyway fails, naming the command."""
    if _UNDER_MPI or request.node.get_closest_marker("slow") is not None:
        yield
        return
    import subprocess

    real = subprocess.Popen.__init__

    def guarded(self: Any, args: Any, *rest: Any, **kw: Any) -> None:
        argv = [args] if isinstance(args, (str, bytes)) else list(args)
        if whole_jobs.launches([os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv]):
            raise AssertionError(
                f"{request.node.nodeid} starts a whole job ({' '.join(map(str, argv))}) but the "
                "harness did not mark it slow: call it through tests/helpers/launching.py"
            )
        real(self, args, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield


def pytest_collection_finish(session: pytest.Session) -> None:
    if _lockstep is None:
        return
    ids = [item.nodeid for item in session.items]
    every = _lockstep.comm.allgather(ids)
    differ = [r for r, other in enumerate(every) if other != ids]
    if differ:
        _abort(f"ranks {differ} collected different tests than rank {_RANK}; aborting")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    report = yield
    if _lockstep is not None:
        _lockstep.agree(report)
    reliability.mark_report(item, report)
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """Under MPI a timed-out test aborts the whole job instead of failing on one rank."""
    if not _UNDER_MPI or not settings.timeout:
        return None

    def expire() -> None:
        _release_stderr()
        sys.stderr.write(
            f"[{_RANK}/{_SIZE}] TIMEOUT: {item.nodeid} ran past {settings.timeout:g} s; "
            "where this rank's main thread is:\n"
        )
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        if frame is not None:
            sys.stderr.write("".join(traceback.format_stack(frame)[-2:]))
        _abort(f"aborting after the time-out of {item.nodeid}")

    timer = threading.Timer(settings.timeout, expire)
    timer.daemon = True
    timer.start()
    item.cancel_timeout = timer.cancel  # type: ignore[attr-defined]
    return True


@pytest.fixture
def comm() -> Any:
    """hpcpar's default communicator (COMM_WORLD's duplicate)."""
    import hpcpar

    return hpcpar.default_comm()
