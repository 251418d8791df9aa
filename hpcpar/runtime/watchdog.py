"""The watchdog: a job whose ranks wait in a call for too long is reported, then ended.

``HPCPAR_WATCHDOG=SECONDS`` (``hpcpar launch --watchdog S``) starts, on every rank, a
monitor thread that never touches MPI. The ranks talk over TCP: rank 0 listens (its
address reaches the others in one broadcast when hpcpar first uses MPI), every rank
connects to it, and each monitor sends, every fraction of the limit, what its rank is
doing: the call it started last (the flight record's ``CURRENT``), whether the rank's
thread is blocked in it, and for how long. A thread is blocked in a call when the
innermost frame of its stack is hpcpar's (a collective, a point-to-point call, a halo
exchange, a checkpoint phase) or, for programs calling mpi4py themselves, a source
line calling an MPI method (``comm.Allreduce(...)``): a rank computing, sleeping or
reading a file is not waiting.

When a rank has been blocked in one call longer than the limit, rank 0 asks every
rank for its stack and last calls and prints one report: the call and its sequence
number, the ranks inside it, each other rank's last call and where its thread is now,
the ranks that left the job (normally, or without finishing), and ranks whose records
differ at one sequence number (a mismatch). Then every rank exits with status
``EXIT_STATUS``, or with ``HPCPAR_WATCHDOG_ACTION=report`` the job goes on (a hang that
changes is reported again). A rank that loses rank 0 reports its own state when it
waits past the limit. While the job is traced (``HPCPAR_TRACE``, every call its own
entry), rank 0 also names, once, a rank that arrives late at the collectives again and
again (``trace.slow_ranks`` over the last ``SLOW_WINDOW`` collectives).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.util
import json
import linecache
import os
import queue
import re
import selectors
import socket
import struct
import sys
import sysconfig
import threading
import time
import traceback
from typing import Any

from ..errors import UsageError
from . import flight
from .settings import value

__all__ = [
    "ENV",
    "ACTION_ENV",
    "EXIT_STATUS",
    "settings",
    "start_from_env",
    "running",
    "blocked_in",
]

ENV = "HPCPAR_WATCHDOG"
ACTION_ENV = "HPCPAR_WATCHDOG_ACTION"
EXIT_STATUS = 4  # every rank's status when the watchdog ends a hung job
_DETAIL_WAIT_S = 3.0  # how long rank 0 waits for the ranks' stacks
_CONNECT_S = 30.0  # how long a rank tries to reach rank 0 at start
SLOW_WINDOW = 50  # collectives the live slow-rank warning looks at (with HPCPAR_TRACE)
_HPCPAR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ours_cache: list[Any] = [-1, ()]  # [len(sys.modules) when made, the folders]


def _checkpoint_folder() -> set[str]:
    """Where ``hpcpar.checkpoint`` lives, loaded or not (found by the import system)."""
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("hpcpar.checkpoint")
        if spec is not None and spec.submodule_search_locations:
            return {os.path.abspath(p) + os.sep for p in spec.submodule_search_locations}
    return set()


_CORE = {_HPCPAR + os.sep} | _checkpoint_folder()


def _ours() -> tuple[str, ...]:
    """The folders of hpcpar's code loaded so far: every loaded ``hpcpar.*`` package's path.

    setup.cfg's ``package_dir`` puts some subpackages outside ``hpcpar/``; this finds
    them where they are (the checkpoint package also when loaded under another name).
    """
    if _ours_cache[0] != len(sys.modules):
        folders = set(_CORE)
        for name, module in list(sys.modules.items()):
            if name.startswith("hpcpar.") and getattr(module, "__path__", None):
                folders.update(os.path.abspath(p) + os.sep for p in module.__path__)
        _ours_cache[:] = [len(sys.modules), tuple(sorted(folders))]
    return _ours_cache[1]


_TOOLS = os.path.join(_HPCPAR, "cli") + os.sep  # command-line tools: they wait on jobs
_THIS_FILE = os.path.abspath(__file__)
# the standard library's waits on locks, events and queues: a thread waiting there waits
# for whoever called them (hpcpar waiting for its communication thread, say)
_LOCK_WAITS = tuple(os.path.abspath(m.__file__) for m in (threading, queue))
_LIBRARIES = tuple(
    os.path.abspath(p) + os.sep
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(key))
)
_MPI_CALL = re.compile(
    r"\.\s*(?:[Aa]llreduce|[Rr]educe|[Bb]cast|[Bb]arrier|[Aa]llgatherv?|[Gg]atherv?|"
    r"[Ss]catterv?|[Aa]lltoall[vw]?|[Rr]educe_scatter(?:_block)?|[Ss]can|[Ee]xscan|"
    r"[Ss]end|[Rr]ecv|[Ss]endrecv|[Ss]sendv?|[Pp]robe|[Ww]ait(?:all|any)?|"
    r"I(?:allreduce|bcast|barrier|allgather|alltoall|reduce|send|recv))\s*\("
)
_state: dict[str, Any] = {}


def running() -> bool:
    """Whether this rank's watchdog has been started."""
    return bool(_state)


def settings(env: Any = None) -> tuple[float, str] | None:
    """The limit and action ``env`` (default: this process's environment) asks for.

    None when ``HPCPAR_WATCHDOG`` is unset or empty.

    Raises:
        UsageError: a limit that is not a positive number of seconds, or an unknown action.
    """
    limit = value(ENV, env)
    return None if limit is None else (limit, value(ACTION_ENV, env))


def start_from_env(comm: Any) -> None:
    """Start this rank's watchdog if ``HPCPAR_WATCHDOG`` asks for one (collective, once).

    ``comm``: a communicator spanning the job (a duplicate of ``COMM_WORLD``); it is
    used once here to pass rank 0's address, never by the watchdog afterwards.

    Raises:
        UsageError: a limit that is not a positive number, or an unknown action.
    """
    if _state:
        return
    chosen = settings()
    if chosen is None:
        return
    limit, action = chosen
    rank, size = comm.Get_rank(), comm.Get_size()
    coordinator = None
    where = None
    if rank == 0:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", 0))
        server.listen(max(size, 8))
        coordinator = _Coordinator(server, size, limit, action)
        coordinator.start()
        where = (server.getsockname()[1], _addresses())
    port, addresses = comm.bcast(where, root=0)
    link = _connect(addresses, port, rank)
    monitor = _Monitor(link, rank, limit, action, threading.main_thread().ident)
    _state.update(limit=limit, action=action, monitor=monitor, coordinator=coordinator)
    monitor.start()
    atexit.register(monitor.goodbye)


def _addresses() -> list[str]:
    """This host's IPv4 addresses, loopback first (any of them may reach rank 0)."""
    found = ["127.0.0.1"]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):
                answer = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
                address = socket.inet_ntoa(answer[20:24])
                if address not in found:
                    found.append(address)
    finally:
        probe.close()
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            if info[4][0] not in found:
                found.append(info[4][0])
    return found


def _connect(addresses: list[str], port: int, rank: int) -> socket.socket:
    deadline = time.monotonic() + _CONNECT_S
    while True:
        for address in addresses:
            with contextlib.suppress(OSError):
                link = socket.create_connection((address, port), timeout=2.0)
                link.settimeout(None)
                _send(link, {"hello": rank})
                return link
        if time.monotonic() > deadline:
            raise UsageError(
                f"{ENV}: rank {rank} cannot reach rank 0's watchdog at "
                f"{', '.join(addresses)} port {port}"
            )
        time.sleep(0.2)


def _send(link: socket.socket, message: dict[str, Any]) -> bool:
    try:
        link.sendall((json.dumps(message, default=str) + "\n").encode())
        return True
    except OSError:
        return False


class _Lines:
    """Newline-delimited JSON messages from a socket, read without blocking."""

    def __init__(self, link: socket.socket) -> None:
        self.link = link
        self.buffer = b""

    def read(self) -> list[dict[str, Any]] | None:
        """The complete messages that have arrived; None once the peer has closed."""
        try:
            data = self.link.recv(1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not data:
            return None
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


# ---- what a rank is doing ----------------------------------------------------------


def blocked_in(frame: Any) -> str | None:
    """How the thread whose innermost frame is ``frame`` waits: ``hpcpar``, ``mpi`` or None.

    ``hpcpar``: inside hpcpar's code, called from the user's (not from one of hpcpar's
    command-line tools, which wait on other processes: a sweep polling Slurm).
    """
    while frame is not None and frame.f_code.co_filename in _LOCK_WAITS:
        frame = frame.f_back  # an Event.wait or Queue.get: judged by who waits
    if frame is None:
        return None
    path = frame.f_code.co_filename
    if path.startswith(_ours()) and path != _THIS_FILE:
        outer = frame  # hpcpar's frames up to the user's: a command-line tool polling a
        while outer is not None and outer.f_code.co_filename.startswith(_ours()):  # queue
            if outer.f_code.co_filename.startswith(_TOOLS):  # is not waiting in a call
                return None
            outer = outer.f_back
        return "hpcpar"
    lineno = frame.f_lineno  # None while the frame has no current line (being set up)
    line = linecache.getline(path, lineno) if lineno is not None else ""
    if line and _MPI_CALL.search(line):
        return "mpi"
    return None


def _call(entry: list[Any] | None) -> dict[str, Any] | None:
    """The call ``entry`` is for (its last call, for a run), as a plain dictionary."""
    if entry is None:
        return None
    calls = entry[flight.CALLS]
    if calls is None:  # a fast-path run: the communicator's sequence says how far it got
        seq = entry[-1]._sequence - 1
    else:
        seq = entry[flight.SEQ] + calls - 1
    return {
        "comm": entry[flight.COMM],
        "seq": seq,
        "operation": entry[flight.OPERATION],
        "algorithm": entry[flight.ALGORITHM],
        "count": _plain(entry[flight.COUNT]),
        "dtype": _plain(entry[flight.DTYPE]),
        "root": _plain(entry[flight.ROOT]),
        "site": flight.site_text(entry[flight.SITE]),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "<>|=":  # a dtype's code: its name
        with contextlib.suppress(TypeError):
            import numpy as np

            return np.dtype(value).name
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value)


class _Monitor(threading.Thread):
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

    def frame(self) -> Any:
        return sys._current_frames().get(self.main) if self.main is not None else None

    def status(self) -> dict[str, Any]:
        frame = self.frame()
        how = blocked_in(frame)
        entry = flight.CURRENT[0]
        call = _call(entry) if how == "hpcpar" else None
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
            "last": _call(entry),
            "at": _frame_text(frame),
            "from": _frame_text(_user_frame(frame)),
        }
        if flight.TRACING:  # every call has its own entry: rank 0 can watch arrival lags
            recent = flight.snapshot(last=2 * SLOW_WINDOW)
            for e in recent:
                e["host"] = self.host
            status["recent"] = recent
        return status

    def detail(self) -> dict[str, Any]:
        frame = self.frame()
        stack = _stack_text(frame)
        return {"rank": self.rank, "stack": stack, "recent": flight.snapshot(last=6)}

    def run(self) -> None:
        self.link.setblocking(False)
        lines = _Lines(self.link)
        waiter = selectors.DefaultSelector()
        waiter.register(self.link, selectors.EVENT_READ)
        while True:
            status = self.status()
            if not self.lost:
                with self.lock:
                    self.lost = not _send(self.link, {"status": status})
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
                            _send(self.link, {"detail": self.detail()})
                    elif command == "abort":
                        _exit()

    def alone(self, status: dict[str, Any]) -> None:
        """Rank 0 has gone: report this rank's own hang, then act on it."""
        if not status["blocked"] or status["waited"] < self.limit or self.reported == self.key:
            return
        self.reported = self.key
        call = status["call"]
        what = _describe(call) if call else f"an MPI call at {status['at']}"
        _print(
            f"rank {self.rank} has waited {status['waited']:.1f} s in {what}; rank 0 (which "
            f"gathers the ranks' reports) has left the job\n" + _indent(self.detail()["stack"])
        )
        if self.action == "abort":
            _exit()

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
            _send(self.link, {"bye": self.rank})
        coordinator = _state.get("coordinator")
        while coordinator is not None and coordinator.is_alive() and not coordinator.all_gone():
            time.sleep(self.poll / 4)


def _user_frame(frame: Any) -> Any:
    """Where the user's code is: the innermost frame that is not hpcpar's.

    Frames of the standard library and of installed libraries that call hpcpar back
    (torch's autograd running a gradient hook within ``loss.backward()``) are passed
    over too, when a frame of the user's own code is further out.
    """
    while frame is not None and frame.f_code.co_filename in _LOCK_WAITS:
        frame = frame.f_back
    while frame is not None and frame.f_code.co_filename.startswith(_ours()):
        frame = frame.f_back
    outer = frame
    while outer is not None and outer.f_code.co_filename.startswith(_LIBRARIES):
        outer = outer.f_back
    return outer if outer is not None and not _starts_the_script(outer) else frame


def _starts_the_script(frame: Any) -> bool:
    """Whether ``frame`` is only the program's start (runpy, ``hpcpar.run``)."""
    name = frame.f_code.co_filename
    return name.startswith("<frozen ") or name.endswith(os.path.join("hpcpar", "run.py"))


def _stack_text(frame: Any) -> str:
    """The stack ending at ``frame``: the user's frames and hpcpar's innermost one.

    The frames that start a script (runpy, ``hpcpar.run``) and hpcpar's frames between
    the user's call and the innermost one are left out.
    """
    if frame is None:
        return ""
    summary = traceback.extract_stack(frame)
    kept = [
        f
        for f in summary
        if not f.filename.startswith("<frozen ")
        and not f.filename.endswith(os.path.join("hpcpar", "run.py"))
    ]
    user = [f for f in kept if not f.filename.startswith(_ours())]
    if kept and kept[-1].filename.startswith(_ours()):
        user.append(kept[-1])
    return "".join(traceback.format_list(user))


def _frame_text(frame: Any) -> str:
    if frame is None:
        return "unknown"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _exit() -> None:
    from .exits import mark_ended
    from .trace import dump

    dump(final=True)  # this rank's flight record, when HPCPAR_TRACE asks for it
    mark_ended(EXIT_STATUS)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STATUS)


def _print(text: str) -> None:
    sys.stderr.write("".join(f"hpcpar watchdog: {line}\n" for line in text.rstrip().split("\n")))
    sys.stderr.flush()


def _indent(text: str) -> str:
    return "".join(f"    {line}\n" for line in text.rstrip().split("\n") if line)


def _describe(call: dict[str, Any]) -> str:
    """``allreduce #57 on world (mpi, count 3, float64)``."""
    return _what(call, f" #{call['seq']} on {call['comm']}")


def _what(call: dict[str, Any], where: str = "") -> str:
    """``allreduce (mpi, count 3, float64)``: the call without where it was."""
    extra = [f"{call['algorithm']}"] if call.get("algorithm") else []
    if call.get("count") is not None:
        extra.append(f"count {call['count']}")
    if call.get("dtype") is not None:
        extra.append(str(_plain(call["dtype"])))
    if call.get("root") is not None:
        extra.append(f"root/peer {call['root']}")
    return f"{call['operation']}{where}" + (f" ({', '.join(extra)})" if extra else "")


# ---- rank 0: gathering and reporting ------------------------------------------------


class _Coordinator(threading.Thread):
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
        with contextlib.suppress(OSError):
            link, _ = self.server.accept()
            link.setblocking(False)
            self.selector.register(link, selectors.EVENT_READ, _Lines(link))

    def receive(self, lines: _Lines) -> None:
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
        _print(self.report(waiting))
        if self.action == "abort":
            from .trace import dump

            dump(final=True)  # before the others leave: the MPI launcher may end this rank
            for rank, link in list(self.links.items()):
                if rank != 0:
                    _send(link, {"cmd": "abort"})
            deadline = time.monotonic() + 2.0  # the others first: the launcher then sees
            while time.monotonic() < deadline and any(  # every rank end with the status
                r not in self.gone for r in self.links if r != 0
            ):
                for key, _ in self.selector.select(timeout=0.1):
                    if key.data is not None:
                        self.receive(key.data)
            _exit()

    def watch_lags(self) -> None:
        """Name, once, a rank that arrives late at collectives again and again (tracing)."""
        recent = {r: s["recent"] for r, s in self.status.items() if s.get("recent")}
        if len(recent) < 2 or len(recent) < len(self.status):
            return
        from .trace import slow_ranks

        for slow in slow_ranks(recent, window=SLOW_WINDOW)[0]:
            if slow["rank"] not in self.warned:
                self.warned.add(slow["rank"])
                _print(
                    f"rank {slow['rank']} arrives {slow['lag'] * 1e3:.1f} ms after the first "
                    f"rank at its collectives (median of the last {slow['calls']}; most often "
                    f"late at {slow['operation']}): the others wait for it"
                )

    def gather_details(self) -> None:
        """Ask every rank for its stack and last calls; wait a little for the answers."""
        self.details = {}
        for link in list(self.links.values()):
            _send(link, {"cmd": "detail"})
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
        from ..layout import format_ranks

        main = _most_common([_key(s.get("call")) for s in waiting.values() if s.get("call")])
        calls = {r: s.get("call") for r, s in self.status.items() if r not in self.gone}
        inside = sorted(r for r, c in calls.items() if c and _key(c) == main)
        longest = max(s["waited"] for s in waiting.values())
        if main is not None:
            call = next(c for c in calls.values() if c and _key(c) == main)
            head = f"{_describe(call)}: rank(s) {format_ranks(inside)} waited {longest:.1f} s"
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
        status = self.status.get(rank)
        detail = self.details.get(rank)
        if rank in self.gone:
            last = status.get("last") if status else None
            after = f", after {_describe(last)}" if last else ""
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
        what = f"last call {_describe(last)}" if last else "no hpcpar call yet"
        if status.get("blocked") and status.get("call"):
            what = f"waiting in {_describe(status['call'])} for {status['waited']:.1f} s"
        lines = [f"rank {rank}: not in it; {what}; now at {status['at']}"]
        if detail and detail.get("stack"):
            lines.append(_indent(detail["stack"]).rstrip("\n"))
        return lines

    def mismatches(self) -> list[str]:
        """Ranks whose records differ at one (communicator, sequence number)."""
        seen: dict[tuple[str, int], dict[str, list[int]]] = {}
        for rank, detail in self.details.items():
            for entry in detail.get("recent", []):
                for offset in range(int(entry.get("calls") or 1)):
                    where = (entry["comm"], int(entry["seq"]) + offset)
                    what = _what(entry)
                    seen.setdefault(where, {}).setdefault(what, []).append(rank)
                    if offset > 64:
                        break
        from ..layout import format_ranks

        out = []
        for (comm, seq), whats in sorted(seen.items()):
            if len(whats) > 1 and not comm.startswith(("p2p", "halo", "checkpoint")):
                parts = "; ".join(
                    f"rank(s) {format_ranks(sorted(set(rs)))} called {what}"
                    for what, rs in whats.items()
                )
                out.append(f"mismatch at {comm} #{seq}: {parts}")
        return out


def _key(call: dict[str, Any] | None) -> tuple[Any, ...] | None:
    if call is None:
        return None
    return (call["comm"], call["seq"], call["operation"])


def _most_common(keys: list[Any]) -> Any:
    if not keys:
        return None
    return max(set(keys), key=keys.count)
