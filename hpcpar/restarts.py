"""``hpcpar launch --restarts K``: start a failed job again at once, and report each recovery.

A job that ends abnormally (a rank killed or crashed, an uncaught error, the watchdog
ending a hang) is started again with the same command, up to ``K`` times: the first
restart at once, each later one after a back-off that doubles (``backoff``, ``2 *
backoff``, ... at most ``MAX_BACKOFF`` seconds). A job that ends with status 0, a usage
error (status 2: the same input would fail again) or that was stopped (``--timeout``,
SIGINT/SIGTERM to the launcher) is not restarted. Every start sees ``HPCPAR_RESTART``
(0, then 1, 2, ...) and, after a failure, ``HPCPAR_RESTART_FAILED`` (the ranks whose
failure ended the previous start), so a program can tell; programs that checkpoint
with ``hpcpar.checkpoint.Checkpointer`` resume from the newest version every rank can
verify (the node-local level on ``/dev/shm`` survives a killed process).

The launcher times each recovery's phases from what it sees: the failure (the first
rank's process ending, seen the moment its connection to the launcher closes), the end
of the rest of the job (the MPI launcher's teardown), the back-off, and the new start
until every rank is up (Python and MPI initialised). It prints one line per restart
and a final report, and ``report`` (``--restart-report FILE``) writes them as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .launcher import TIMEOUT_EXIT, Attempt, LaunchPlan, start_job
from .layout import format_ranks
from .runtime.results import atomic_write

__all__ = ["MAX_BACKOFF", "Recovery", "RestartReport", "restartable", "run_restarting"]

MAX_BACKOFF = 30.0  # seconds: the longest wait before a restart
USAGE_EXIT = 2  # bad input: every start would fail the same way


def restartable(attempt: Attempt) -> bool:
    """Whether a start that ended this way is worth starting again."""
    return attempt.status not in (0, USAGE_EXIT) and not attempt.interrupted


def backoff_delay(restart: int, backoff: float) -> float:
    """Seconds to wait before restart number ``restart`` (1, 2, ...)."""
    if restart <= 1:
        return 0.0
    return min(MAX_BACKOFF, backoff * 2.0 ** (restart - 2))


@dataclass
class Recovery:
    """One restart and its phases, in seconds (``None`` where the launcher saw no time).

    Attributes:
        restart: Its number (1 for the first).
        failed: The ranks whose failure ended the start before it.
        why: How that start ended.
        status: That start's exit status.
        ran: How long that start ran.
        teardown: From the first rank's end to the end of the rest of that start.
        wait: The back-off before the new start.
        start: From the new start to every one of its ranks up.
        down: From the failure to every rank of the new start up (the time lost to
            recovery, not counting the work since the program's last checkpoint).
    """

    restart: int
    failed: list[int]
    why: str
    status: int
    ran: float
    teardown: float | None
    wait: float
    start: float | None = None
    down: float | None = None


@dataclass
class RestartReport:
    """What ``run_restarting`` did: every recovery, and how the job ended."""

    restarts_allowed: int
    status: int = 0
    seconds: float = 0.0
    recoveries: list[Recovery] = field(default_factory=list)
    gave_up: bool = False

    def lines(self) -> list[str]:
        """The final report, a line each."""
        n = len(self.recoveries)
        head = (
            f"gave up after {n} restart(s) of {self.restarts_allowed} allowed; the last start "
            f"ended with status {self.status}"
            if self.gave_up
            else f"the job ended with status {self.status} after {n} restart(s)"
        )
        out = [f"{head} ({self.seconds:.1f} s in all)"]
        for r in self.recoveries:
            phases = ", ".join(
                f"{name} {_seconds(value)}"
                for name, value in (
                    ("teardown", r.teardown),
                    ("back-off", r.wait),
                    ("new start", r.start),
                    ("down", r.down),
                )
            )
            who = f"rank(s) {format_ranks(r.failed)}" if r.failed else "the job"
            out.append(
                f"restart {r.restart}: {who} failed after {r.ran:.1f} s (status {r.status}); "
                f"{phases}"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the report."""
        return asdict(self)


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"


def run_restarting(
    plan: LaunchPlan,
    restarts: int,
    *,
    timeout: float | None = None,
    backoff: float = 1.0,
    report: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run ``plan``, starting it again after a failure, at most ``restarts`` times.

    Args:
        plan: The job.
        restarts: The most restarts (0: run once, as ``run_job`` does).
        timeout: Seconds for all starts together (``--timeout``); the job is killed and
            124 returned when they pass.
        backoff: The wait before the second restart; it doubles for each later one.
        report: A file to write the report to as JSON (rank-independent, atomic).
        environ: Variables added to every start (tests).

    Returns:
        The exit status of the last start.
    """
    began = time.monotonic()
    deadline = None if timeout is None else began + timeout
    result = RestartReport(restarts)
    extra = {**(environ or {}), "HPCPAR_RESTART": "0"}
    previous: Attempt | None = None
    try:
        for number in range(restarts + 1):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                sys.stderr.write(f"hpcpar launch: the job ran past --timeout {timeout:g} s\n")
                result.status = TIMEOUT_EXIT
                break
            then = f"Restarting ({number + 1} of {restarts})" if number < restarts else None
            attempt = start_job(plan, remaining, extra, then)
            if previous is not None:
                last = result.recoveries[-1]
                if attempt.ready is not None:
                    last.start = attempt.ready - attempt.started
                    failed_at = previous.failed_at or previous.ended
                    last.down = attempt.ready - failed_at
            result.status = attempt.status
            if not restarts or not restartable(attempt):
                break
            if number == restarts:
                result.gave_up = True
                break
            wait = backoff_delay(number + 1, backoff)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            teardown = None if attempt.failed_at is None else attempt.ended - attempt.failed_at
            result.recoveries.append(
                Recovery(
                    number + 1,
                    attempt.failed,
                    attempt.why or f"status {attempt.status}",
                    attempt.status,
                    attempt.ended - attempt.started,
                    teardown,
                    wait,
                )
            )
            later = f" in {wait:g} s" if wait else ""
            who = f"rank(s) {format_ranks(attempt.failed)}" if attempt.failed else "the job"
            sys.stderr.write(
                f"hpcpar launch: restart {number + 1} of {restarts}{later} ({who} failed, "
                f"status {attempt.status})\n"
            )
            sys.stderr.flush()
            time.sleep(wait)
            extra = {
                **(environ or {}),
                "HPCPAR_RESTART": str(number + 1),
                "HPCPAR_RESTART_FAILED": ",".join(str(r) for r in attempt.failed),
            }
            previous = attempt
    except KeyboardInterrupt:
        result.status = 130
    result.seconds = time.monotonic() - began
    if result.recoveries or result.gave_up:
        for line in result.lines():
            sys.stderr.write(f"hpcpar launch: {line}\n")
    if report is not None:
        atomic_write(Path(report), json.dumps(result.to_json(), indent=1) + "\n")
    return result.status
