"""The reliability figures of a test run: faults, hangs and bad inputs the tests tried.

Tests say what they try with ``@pytest.mark.reliability(KIND)``: ``fault`` (a
checkpoint fault injected: a kill, a lost node, flipped bytes, a full disk), ``hang``
(a job made to hang under the watchdog) or ``bad_input`` (input that must be refused
with a clear error). A test that tries many cases records how many with
``record_property("reliability_cases", n)``, and a hang test its time to report with
``record_property("time_to_report", seconds)``. A passing test counts its cases as
survived / reported / refused cleanly; a failing one as lost / unreported / unclear.

Each session prints its tally; with ``HPCPAR_RELIABILITY_DIR`` set, rank 0 of each
session (the controller, when pytest-xdist runs it) writes it there as JSON and
``dev.py test`` adds the sessions up at the end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

KINDS = ("fault", "hang", "bad_input")
ENV = "HPCPAR_RELIABILITY_DIR"


class Tally:
    def __init__(self) -> None:
        self.cases = dict.fromkeys(KINDS, 0)
        self.good = dict.fromkeys(KINDS, 0)
        self.report_times: list[float] = []

    def add(self, kind: str, cases: int, passed: bool, properties: dict[str, Any]) -> None:
        self.cases[kind] += cases
        if passed:
            self.good[kind] += cases
            if "time_to_report" in properties:
                self.report_times.append(float(properties["time_to_report"]))

    def as_dict(self) -> dict[str, Any]:
        return {"cases": self.cases, "good": self.good, "report_times": self.report_times}


def describe(cases: dict[str, int], good: dict[str, int], times: list[float]) -> str:
    """One line: faults injected / survived / data lost, hangs, bad inputs."""
    slowest = f", slowest {max(times):.1f} s to report" if times else ""
    return (
        f"checkpoint faults injected {cases['fault']}, survived {good['fault']}, data lost "
        f"{cases['fault'] - good['fault']}; hang cases {cases['hang']}, reported "
        f"{good['hang']}{slowest}; bad inputs tried {cases['bad_input']}, clear errors "
        f"{good['bad_input']}"
    )


class Plugin:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.tally = Tally()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped or (
            report.when != "call" and not (report.when == "setup" and report.failed)
        ):
            return  # (a test skipped at this rank count tried nothing)
        kind = getattr(report, "reliability_kind", None)
        if kind is None:
            return
        properties = dict(report.user_properties)
        cases = int(properties.get("reliability_cases", 1))
        self.tally.add(kind, cases, report.passed, properties)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        t = self.tally
        if not any(t.cases.values()):
            return
        terminalreporter.write_line(f"reliability: {describe(t.cases, t.good, t.report_times)}")
        folder = os.environ.get(ENV)
        # under pytest-xdist the controller receives every worker's reports: it writes
        # the session's tally, and the workers (which saw a share of them) write none
        if folder and self.rank == 0 and not os.environ.get("PYTEST_XDIST_WORKER"):
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / f"session-{os.getpid()}.json").write_text(json.dumps(t.as_dict()))


def mark_report(item: pytest.Item, report: pytest.TestReport) -> None:
    """Carry the test's reliability kind over to its report."""
    marker = item.get_closest_marker("reliability")
    if marker is not None:
        kind = marker.args[0]
        if kind not in KINDS:
            raise ValueError(f"reliability kind {kind!r}: one of {KINDS}")
        report.reliability_kind = kind  # type: ignore[attr-defined]


def total(folder: Path) -> str | None:
    """Every session's tally in ``folder`` added up, in words; None if there is none."""
    cases = dict.fromkeys(KINDS, 0)
    good = dict.fromkeys(KINDS, 0)
    times: list[float] = []
    files = sorted(folder.glob("session-*.json"))
    for path in files:
        doc = json.loads(path.read_text())
        for kind in KINDS:
            cases[kind] += int(doc["cases"][kind])
            good[kind] += int(doc["good"][kind])
        times += [float(t) for t in doc["report_times"]]
    return describe(cases, good, times) if files else None
