"""One rank's side of the watchdog: a thread that sends its rank's state to rank 0."""

from __future__ import annotations

import selectors
import socket
import sys
import threading
import time
from typing import Any

from .. import flight
from ..switches import HOT
from .report import SLOW_WINDOW, call_record, describe, end_job, indent, say
from .stacks import blocked_in, frame_text, stack_text, user_frame
from .wire import Lines, send_line

__all__ = ["Monitor"]


class Monitor(threading.Thread):
    """One rank's side: sends its state to rank 0, answers its requests."""

    def __init__(
        self, link: socket.socket, rank: int, limit: float, action: str, main: int | None
    ) -> None:
        super().__init__(name="hpcpar-watchdog", daemon=True)
        self.link, self.rank, self.limit, self.action, self.main = link, rank, limit, action, main
        self.poll = min(1.0, limit / 4)
        self.key: tuple[Any, ...] | None = None
        self.since = 0.0
        self.lost = False
        self.reported: tuple[Any, ...] | None = None
        self.lock = threading.Lock()
        self.host = socket.gethostname()
        self.coordinator: Any = None  # rank 0's coordinator thread, on rank 0

    def frame(self) -> Any:
        """The main thread's innermost frame now."""
        return sys._current_frames().get(self.main) if self.main is not None else None

    def status(self) -> dict[str, Any]:
        """This rank's state: how it waits, for how long, in which call, and where."""
        frame = self.frame()
        how = blocked_in(frame)
        entry = HOT.current
        call = call_record(entry) if how == "hpcpar" else None
        where = (frame.f_code, frame.f_lineno) if frame is not None else None
        key = (how, id(entry), call["seq"] if call else None, where if how == "mpi" else None)
        now = time.monotonic()
        if how is None:
            self.key = None
        elif key != self.key:
            self.key, self.since = key, now
        status = {
            "rank": self.rank,
            "blocked": how,
            "waited": now - self.since if how else 0.0,
            "call": call,
            "last": call_record(entry),
            "at": frame_text(frame),
            "from": frame_text(user_frame(frame)),
        }
        if flight.TRACING:  # every call has its own entry: rank 0 can watch arrival lags
            recent = flight.snapshot(last=2 * SLOW_WINDOW)
            for e in recent:
                e["host"] = self.host
            status["recent"] = recent
        return status

    def detail(self) -> dict[str, Any]:
        """This rank's stack and last calls, for the report."""
        frame = self.frame()
        stack = stack_text(frame)
        return {"rank": self.rank, "stack": stack, "recent": flight.snapshot(last=6)}

    def run(self) -> None:
        """Send the state every poll; answer rank 0's requests between."""
        self.link.setblocking(False)
        lines = Lines(self.link)
        waiter = selectors.DefaultSelector()
        waiter.register(self.link, selectors.EVENT_READ)
        while True:
            status = self.status()
            if not self.lost:
                with self.lock:
                    self.lost = not send_line(self.link, {"status": status})
            if self.lost:
                self.alone(status)
                time.sleep(self.poll)
                continue
            deadline = time.monotonic() + self.poll
            while not self.lost and (left := deadline - time.monotonic()) > 0:
                if not waiter.select(timeout=left):
                    continue
                messages = lines.read()
                if messages is None:
                    self.lost = True
                    break
                for message in messages:
                    command = message.get("cmd")
                    if command == "detail":
                        with self.lock:
                            send_line(self.link, {"detail": self.detail()})
                    elif command == "abort":
                        end_job()

    def alone(self, status: dict[str, Any]) -> None:
        """Rank 0 has gone: report this rank's own hang, then act on it."""
        if not status["blocked"] or status["waited"] < self.limit or self.reported == self.key:
            return
        self.reported = self.key
        call = status["call"]
        what = describe(call) if call else f"an MPI call at {status['at']}"
        say(
            f"rank {self.rank} has waited {status['waited']:.1f} s in {what}; rank 0 (which "
            f"gathers the ranks' reports) has left the job\n" + indent(self.detail()["stack"])
        )
        if self.action == "abort":
            end_job()

    def goodbye(self) -> None:
        """At a normal exit of the interpreter: tell rank 0 this rank finished.

        On rank 0 (the coordinator's rank), wait until every rank has finished or left
        before returning: MPI is finalized after the interpreter (and this thread) has
        gone, so a rank 0 that returned at once would leave a later hang of the other
        ranks unwatched. It waits no longer than MPI_Finalize would, and a hang among
        the others is reported and ends the job as any other.
        """
        with self.lock:
            self.link.setblocking(True)
            send_line(self.link, {"bye": self.rank})
        coordinator = self.coordinator
        while coordinator is not None and coordinator.is_alive() and not coordinator.all_gone():
            time.sleep(self.poll / 4)
