"""Rank 0's side of the watchdog: gathers every rank's state, reports a hang, ends the job."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
from typing import Any

from .report import (
    ACTION_ENV,
    EXIT_STATUS,
    SLOW_WINDOW,
    call_key,
    call_text,
    describe,
    end_job,
    indent,
    most_common,
    say,
)
from .wire import Lines, send_line

__all__ = ["Coordinator"]

_DETAIL_WAIT_S = 3.0  # how long rank 0 waits for the ranks' stacks


class Coordinator(threading.Thread):
    """Rank 0's side: collects every rank's state, reports a hang, ends the job."""

    def __init__(self, server: socket.socket, size: int, limit: float, action: str) -> None:
        super().__init__(name="hpcpar-watchdog-coordinator", daemon=True)
        self.server, self.size, self.limit, self.action = server, size, limit, action
        self.selector = selectors.DefaultSelector()
        self.links: dict[int, socket.socket] = {}
        self.status: dict[int, dict[str, Any]] = {}
        self.gone: dict[int, str] = {}
        self.details: dict[int, dict[str, Any]] = {}
        self.reported: Any = None
        self.warned: set[int] = set()  # ranks already named as slow

    def run(self) -> None:
        """Accept the ranks, read their messages, and check for a hang every poll."""
        self.server.setblocking(False)
        self.selector.register(self.server, selectors.EVENT_READ, None)
        poll = min(1.0, self.limit / 4)
        while True:
            for key, _ in self.selector.select(timeout=poll):
                if key.data is None:
                    self.accept()
                else:
                    self.receive(key.data)
            self.check()

    def all_gone(self) -> bool:
        """Whether every rank has finished or left (any thread)."""
        return len(self.gone) >= self.size

    def accept(self) -> None:
        """Take a rank's new connection."""
        with contextlib.suppress(OSError):
            link, _ = self.server.accept()
            link.setblocking(False)
            self.selector.register(link, selectors.EVENT_READ, Lines(link))

    def receive(self, lines: Lines) -> None:
        """Read one rank's messages: hello, status, detail or bye."""
        messages = lines.read()
        rank = next((r for r, link in self.links.items() if link is lines.link), None)
        if messages is None:
            self.selector.unregister(lines.link)
            lines.link.close()
            if rank is not None and rank not in self.gone:
                self.gone[rank] = "left the job without finishing (os._exit, a signal or a crash)"
            return
        for message in messages:
            if "hello" in message:
                rank = int(message["hello"])
                self.links[rank] = lines.link
            elif "status" in message and rank is not None:
                self.status[rank] = message["status"]
            elif "detail" in message and rank is not None:
                self.details[rank] = message["detail"]
            elif "bye" in message and rank is not None:
                self.gone[rank] = "exited normally (end of the program or sys.exit)"

    def check(self) -> None:
        """Report ranks waiting past the limit (once per state), then act on it."""
        self.watch_lags()
        waiting = {
            r: s
            for r, s in self.status.items()
            if r not in self.gone and s.get("blocked") and s["waited"] >= self.limit
        }
        if not waiting:
            return
        state = tuple(sorted((r, json.dumps(s.get("call") or s["at"])) for r, s in waiting.items()))
        if state == self.reported:
            return
        self.reported = state
        self.gather_details()
        say(self.report(waiting))
        if self.action == "abort":
            from ..trace import dump

            dump(final=True)  # before the others leave: the MPI launcher may end this rank
            for rank, link in list(self.links.items()):
                if rank != 0:
                    send_line(link, {"cmd": "abort"})
            deadline = time.monotonic() + 5.0  # the others first: the launcher then sees
            while time.monotonic() < deadline and any(  # every rank end with the status
                r not in self.gone for r in self.links if r != 0
            ):
                for key, _ in self.selector.select(timeout=0.1):
                    if key.data is not None:
                        self.receive(key.data)
            end_job()

    def watch_lags(self) -> None:
        """Name, once, a rank that arrives late at collectives again and again (tracing)."""
        recent = {r: s["recent"] for r, s in self.status.items() if s.get("recent")}
        if len(recent) < 2 or len(recent) < len(self.status):
            return
        from ..trace import slow_ranks

        for slow in slow_ranks(recent, window=SLOW_WINDOW)[0]:
            if slow["rank"] not in self.warned:
                self.warned.add(slow["rank"])
                say(
                    f"rank {slow['rank']} arrives {slow['lag'] * 1e3:.1f} ms after the first "
                    f"rank at its collectives (median of the last {slow['calls']}; most often "
                    f"late at {slow['operation']}): the others wait for it"
                )

    def gather_details(self) -> None:
        """Ask every rank for its stack and last calls; wait a little for the answers."""
        self.details = {}
        for link in list(self.links.values()):
            send_line(link, {"cmd": "detail"})
        deadline = time.monotonic() + _DETAIL_WAIT_S
        live = [r for r in self.links if r not in self.gone]
        while time.monotonic() < deadline and any(r not in self.details for r in live):
            for key, _ in self.selector.select(timeout=0.1):
                if key.data is None:
                    self.accept()
                else:
                    self.receive(key.data)
            live = [r for r in self.links if r not in self.gone]

    def report(self, waiting: dict[int, dict[str, Any]]) -> str:
        """The hang report: the call, the ranks inside it, and every rank's state."""
        from ...layout import format_ranks

        main = most_common([call_key(s.get("call")) for s in waiting.values() if s.get("call")])
        calls = {r: s.get("call") for r, s in self.status.items() if r not in self.gone}
        inside = sorted(r for r, c in calls.items() if c and call_key(c) == main)
        longest = max(s["waited"] for s in waiting.values())
        if main is not None:
            call = next(c for c in calls.values() if c and call_key(c) == main)
            head = f"{describe(call)}: rank(s) {format_ranks(inside)} waited {longest:.1f} s"
        else:  # the MPI library called directly: every rank blocked in it is in it
            at = next(iter(waiting.values()))["at"]
            inside = sorted(
                r
                for r, s in self.status.items()
                if r not in self.gone and s.get("blocked") == "mpi"
            )
            head = f"an MPI call: rank(s) {format_ranks(inside)} waited {longest:.1f} s ({at})"
        out = [f"{head} (limit {self.limit:g} s)"]
        for rank in range(self.size):
            out.extend(self.about(rank, inside, waiting))
        out.extend(self.mismatches())
        if self.action == "abort":
            out.append(
                f"ending the job (exit status {EXIT_STATUS}); {ACTION_ENV}=report only reports"
            )
        else:
            out.append("the job goes on (HPCPAR_WATCHDOG_ACTION=report)")
        return "\n".join(out)

    def about(self, rank: int, inside: list[int], waiting: dict[int, Any]) -> list[str]:
        """The report's lines about one rank."""
        status = self.status.get(rank)
        detail = self.details.get(rank)
        if rank in self.gone:
            last = status.get("last") if status else None
            after = f", after {describe(last)}" if last else ""
            return [f"rank {rank}: {self.gone[rank]}{after}"]
        if status is None:
            return [f"rank {rank}: never reported (not connected)"]
        if status.get("blocked") == "mpi":  # named by its call site, whatever hpcpar did last
            return [f"rank {rank}: in an MPI call for {status['waited']:.1f} s at {status['at']}"]
        if rank in inside:
            return [
                f"rank {rank}: inside it for {status['waited']:.1f} s, called at {status['from']}"
            ]
        last = status.get("last")
        what = f"last call {describe(last)}" if last else "no hpcpar call yet"
        if status.get("blocked") and status.get("call"):
            what = f"waiting in {describe(status['call'])} for {status['waited']:.1f} s"
        lines = [f"rank {rank}: not in it; {what}; now at {status['at']}"]
        if detail and detail.get("stack"):
            lines.append(indent(detail["stack"]).rstrip("\n"))
        return lines

    def mismatches(self) -> list[str]:
        """Ranks whose records differ at one (communicator, sequence number)."""
        seen: dict[tuple[str, int], dict[str, list[int]]] = {}
        for rank, detail in self.details.items():
            for entry in detail.get("recent", []):
                for offset in range(int(entry.get("calls") or 1)):
                    where = (entry["comm"], int(entry["seq"]) + offset)
                    what = call_text(entry)
                    seen.setdefault(where, {}).setdefault(what, []).append(rank)
                    if offset > 64:
                        break
        from ...layout import format_ranks

        out = []
        for (comm, seq), whats in sorted(seen.items()):
            if len(whats) > 1 and not comm.startswith(("p2p", "halo", "checkpoint")):
                parts = "; ".join(
                    f"rank(s) {format_ranks(sorted(set(rs)))} called {what}"
                    for what, rs in whats.items()
                )
                out.append(f"mismatch at {comm} #{seq}: {parts}")
        return out
