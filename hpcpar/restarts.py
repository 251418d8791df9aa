"""``hpcpar launch --restarts K``: start a failed job again at once, and report each recovery.

A job that ends abnormally (a rank killed or crashed, an uncaught error, the watchdog
ending a hang) is started again with the same command, up to ``K`` times, at once. Only
failures in quick succession wait: a start that failed within ``QUICK`` seconds of
starting, after another such start, waits ``backoff`` before the next, and each further
quick failure doubles the wait (at most ``MAX_BACKOFF`` seconds); a start that ran
longer resets it. A job that ends with status 0, a usage
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
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .launcher import TIMEOUT_EXIT, Attempt, LaunchPlan, start_job
from .layout import format_ranks, node_assignment
from .runtime.results import atomic_write

__all__ = [
    "MAX_BACKOFF",
    "QUICK",
    "Recovery",
    "RestartReport",
    "restartable",
    "run_restarting",
    "survivors",
]

MAX_BACKOFF = 30.0  # seconds: the longest wait before a restart
QUICK = 10.0  # seconds: a start that failed sooner is a quick failure (a crash loop)
USAGE_EXIT = 2  # bad input: every start would fail the same way


def restartable(attempt: Attempt) -> bool:
    """Whether a start that ended this way is worth starting again."""
    return attempt.status not in (0, USAGE_EXIT) and not attempt.interrupted


def backoff_delay(quick: int, backoff: float) -> float:
    """Seconds to wait after the ``quick``-th quick failure in a row (1, 2, ...)."""
    if quick <= 1:
        return 0.0
    return min(MAX_BACKOFF, backoff * 2.0 ** (quick - 2))


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
        lost_nodes: The nodes lost with that start.
        ranks: The new start's rank count.
        layout: The new start's virtual node layout (``None``: as before).
        spares: Spare nodes brought in for lost ones.
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
    lost_nodes: list[int] = field(default_factory=list)
    ranks: int = 0
    layout: str | None = None
    spares: int = 0


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
            if r.lost_nodes:
                who = f"node(s) {format_ranks(r.lost_nodes)}"
            out.append(
                f"restart {r.restart}: {who} failed after {r.ran:.1f} s (status {r.status}); "
                f"{_restarted_on(r)}{phases}"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the report."""
        return asdict(self)


def _restarted_on(r: Recovery) -> str:
    if r.spares:
        return f"{r.spares} spare node(s) in their place; "
    if r.lost_nodes:
        return f"restarted on the {r.ranks} rank(s) of the other nodes ({r.layout}); "
    return ""


def survivors(layout: str | None, ranks: int, lost: list[int]) -> tuple[int, str | None]:
    """The rank count and layout of a job without the ``lost`` nodes of ``layout``.

    The surviving nodes keep their sizes and order (``nodes:2,2`` less node 0 is
    ``nodes:2``); a job without a layout is one node.
    """
    node_of = node_assignment(layout, ranks) if layout else [0] * ranks
    sizes = [node_of.count(n) for n in sorted(set(node_of)) if n not in lost]
    left = sum(sizes)
    return left, (f"nodes:{','.join(map(str, sizes))}" if left else None)


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
    replan: Callable[[int, str | None], LaunchPlan] | None = None,
    layout: str | None = None,
    min_ranks: int = 1,
    spares: int = 0,
) -> int:
    """Run ``plan``, starting it again after a failure, at most ``restarts`` times.

    A start that lost (virtual) nodes is started again with spare nodes in their place
    while ``spares`` remain (the same ranks and layout: the new nodes' storage is
    empty), else on the surviving nodes' ranks (``replan(ranks, layout)`` makes that
    plan), unless fewer than ``min_ranks`` are left.

    Args:
        plan: The job.
        restarts: The most restarts (0: run once, as ``run_job`` does).
        timeout: Seconds for all starts together (``--timeout``); the job is killed and
            124 returned when they pass.
        backoff: The wait after the second quick failure in a row; it doubles with each
            further one (see the module docstring).
        report: A file to write the report to as JSON (rank-independent, atomic).
        environ: Variables added to every start (tests).
        replan: The plan for another rank count and layout (``None``: no node loss is
            survived but with spares).
        layout: ``plan``'s virtual node layout.
        min_ranks: The fewest ranks a restart may run on.
        spares: Nodes kept idle to replace lost ones.

    Returns:
        The exit status of the last start.
    """
    restarter = _Restarter(plan, restarts, timeout, backoff, dict(environ or {}))
    restarter.replan, restarter.layout = replan, layout
    restarter.min_ranks, restarter.spares = min_ranks, spares  # the node-loss policy
    try:
        restarter.run()
    except KeyboardInterrupt:
        restarter.result.status = 130
    result = restarter.result
    result.seconds = time.monotonic() - restarter.began
    if result.recoveries or result.gave_up:
        for line in result.lines():
            sys.stderr.write(f"hpcpar launch: {line}\n")
    if report is not None:
        atomic_write(Path(report), json.dumps(result.to_json(), indent=1) + "\n")
    return result.status


class _Restarter:
    """``run_restarting``'s loop and what it keeps between starts."""

    def __init__(
        self,
        plan: LaunchPlan,
        restarts: int,
        timeout: float | None,
        backoff: float,
        environ: dict[str, str],
    ) -> None:
        self.plan, self.restarts, self.timeout, self.backoff = plan, restarts, timeout, backoff
        self.environ = environ
        self.replan: Callable[[int, str | None], LaunchPlan] | None = None
        self.layout: str | None = None
        self.min_ranks, self.spares = 1, 0
        self.began = time.monotonic()
        self.deadline = None if timeout is None else self.began + timeout
        self.result = RestartReport(restarts)
        self.quick = 0  # quick failures in a row

    def run(self) -> None:
        extra = {**self.environ, "HPCPAR_RESTART": "0"}
        previous: Attempt | None = None
        for number in range(self.restarts + 1):
            remaining = None if self.deadline is None else self.deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                sys.stderr.write(f"hpcpar launch: the job ran past --timeout {self.timeout:g} s\n")
                self.result.status = TIMEOUT_EXIT
                return
            then = (
                f"Restarting ({number + 1} of {self.restarts})" if number < self.restarts else None
            )
            attempt = start_job(self.plan, remaining, extra, then)
            if previous is not None and attempt.ready is not None:
                last = self.result.recoveries[-1]
                last.start = attempt.ready - attempt.started
                last.down = attempt.ready - (previous.failed_at or previous.ended)
            self.result.status = attempt.status
            if not self.restarts or not restartable(attempt):
                return
            if number == self.restarts:
                self.result.gave_up = True
                return
            recovery = self._recovery(number + 1, attempt)
            if recovery is None:
                self.result.gave_up = True
                return
            self.result.recoveries.append(recovery)
            who = f"rank(s) {format_ranks(attempt.failed)}" if attempt.failed else "the job"
            later = f" in {recovery.wait:g} s" if recovery.wait else ""
            sys.stderr.write(
                f"hpcpar launch: restart {number + 1} of {self.restarts}{later} ({who} failed, "
                f"status {attempt.status})\n"
            )
            sys.stderr.flush()
            time.sleep(recovery.wait)
            extra = {
                **self.environ,
                "HPCPAR_RESTART": str(number + 1),
                "HPCPAR_RESTART_FAILED": ",".join(str(r) for r in attempt.failed),
            }
            previous = attempt

    def _recovery(self, number: int, attempt: Attempt) -> Recovery | None:
        """The next restart's record (its plan made), or None when it cannot be."""
        self.quick = self.quick + 1 if attempt.ended - attempt.started < QUICK else 0
        wait = backoff_delay(self.quick, self.backoff)
        if self.deadline is not None:
            wait = min(wait, max(0.0, self.deadline - time.monotonic()))
        teardown = None if attempt.failed_at is None else attempt.ended - attempt.failed_at
        recovery = Recovery(
            number,
            attempt.failed,
            attempt.why or f"status {attempt.status}",
            attempt.status,
            attempt.ended - attempt.started,
            teardown,
            wait,
            lost_nodes=attempt.lost_nodes,
            ranks=self.plan.ranks,
        )
        if attempt.lost_nodes and not self._place(recovery, attempt):
            return None
        return recovery

    def _place(self, recovery: Recovery, attempt: Attempt) -> bool:
        """Where the start after a node loss runs: on spares, or on the other nodes' ranks.

        False (and one line said) when neither can be.
        """
        lost = attempt.lost_nodes
        # every rank of a lost node failed, whichever the launcher saw end first
        node_of = node_assignment(self.layout, self.plan.ranks) if self.layout else []
        attempt.failed = recovery.failed = [r for r, n in enumerate(node_of) if n in lost]
        if len(lost) <= self.spares:
            self.spares -= len(lost)
            recovery.spares = len(lost)
            return True
        ranks, layout = survivors(self.layout, self.plan.ranks, lost)
        if self.replan is None:
            refusal = "this launch cannot restart on fewer nodes"
        elif ranks < self.min_ranks:
            refusal = f"{ranks} rank(s) are left, fewer than --min-ranks {self.min_ranks}"
        else:
            self.plan, self.layout = self.replan(ranks, layout), layout
            recovery.ranks, recovery.layout = ranks, layout
            return True
        sys.stderr.write(
            f"hpcpar launch: node(s) {format_ranks(lost)} lost and no spare node left; "
            f"{refusal}: not restarting\n"
        )
        return False
