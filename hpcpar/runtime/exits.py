"""Which ranks of a job finished normally: markers that ``hpcpar launch`` reads at the end.

``hpcpar launch`` gives the job a folder (``HPCPAR_EXIT_DIR``). A rank that starts
using hpcpar's communicator writes ``rank<R>.started`` there, and at a normal exit of
its interpreter (the end of the program, or ``sys.exit``) ``rank<R>.exited``. A rank
with the first marker and not the second left some other way (``os._exit``, a signal, a
crash of the interpreter), possibly while the other ranks still waited for it in a
collective; MPI launchers may then end the job with status 0 and no word, so the
launcher reports those ranks and fails (``EARLY_EXIT``). Ranks on other hosts write to
their own host's folder, so the check covers the launching host's ranks.

A rank that ends the job on purpose with ``os._exit`` (the watchdog) first writes
``rank<R>.ended`` holding its status: the launcher then reports that status, whatever
the MPI launcher made of the ranks it killed after the first one left.

Once the MPI launcher sees one rank go, it kills the others, so "which ranks did not
finish" names them all. The rank that failed first is found two ways: Python's
``faulthandler`` writes ``rank<R>.fault`` when a rank dies of a fatal signal
(SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) with the line it was on, and every rank
holds a connection to the launcher that ends with its process (``Departures``), so the
launcher sees which ended first.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import selectors
import socket
import sysconfig
import threading
import time
from pathlib import Path
from typing import IO

__all__ = [
    "ENV",
    "EARLY_EXIT",
    "Departures",
    "ended",
    "faults",
    "lost_nodes",
    "mark_node_lost",
    "mark_ended",
    "mark_started",
    "unfinished",
]

ENV = "HPCPAR_EXIT_DIR"
SOCKET = "departures.sock"  # in the folder: each rank's connection ends when it does
EARLY_EXIT = 3  # hpcpar launch's status when the job said 0 but ranks left unfinished


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # the folder is on another host, or gone
        path.write_text(f"{os.getpid()}\n")


def mark_started(rank: int) -> None:
    """Record that ``rank`` runs, and that it exits normally when it does (if launched)."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    global _rank
    _rank = rank
    _touch(Path(folder) / f"rank{rank}.started")
    atexit.register(_say_goodbye)  # after the exit mark below (last registered runs first)
    atexit.register(_touch, Path(folder) / f"rank{rank}.exited")
    _record_faults(Path(folder) / f"rank{rank}.fault")
    _say_hello(Path(folder) / SOCKET, rank)


_rank: int | None = None
_fault_file: IO[str] | None = None
_hello: socket.socket | None = None


def _say_hello(path: Path, rank: int) -> None:
    """Connect to the launcher's socket for the life of this process (see Departures)."""
    global _hello
    if not path.exists():
        return  # the folder is on another host, or the launcher watches nothing
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(5.0)
    try:
        conn.connect(str(path))
        conn.sendall(f"{rank}\n".encode())
    except OSError:
        conn.close()
        return
    _hello = conn


def _say_goodbye() -> None:
    """Close the launcher's connection at a normal exit (its end then says the same)."""
    if _hello is not None:
        _hello.close()


def _record_faults(path: Path) -> None:
    """Send ``faulthandler``'s report of a fatal signal to ``path``.

    Unless the program already enabled faulthandler itself: its choice stands.
    """
    global _fault_file
    if faulthandler.is_enabled():
        return
    with contextlib.suppress(OSError):
        _fault_file = open(path, "w")  # noqa: SIM115 (open for the life of the process)
        faulthandler.enable(_fault_file)


def mark_ended(status: int) -> None:
    """Record that this rank ends the job on purpose with ``status`` (before ``os._exit``)."""
    folder = os.environ.get(ENV)
    if folder and _rank is not None:
        with contextlib.suppress(OSError):
            (Path(folder) / f"rank{_rank}.ended").write_text(f"{status}\n")


def mark_node_lost(node: int) -> None:
    """Record that (virtual) node ``node`` is lost with its processes and storage.

    A real node's loss is seen by the launcher; a virtual node's (a fault injected
    with ``HPCPAR_CHECKPOINT_FAULT=...,node=N``) is told by its ranks, before they die.
    """
    folder = os.environ.get(ENV)
    if folder:
        _touch(Path(folder) / f"node{node}.lost")


def lost_nodes(folder: Path) -> list[int]:
    """The nodes recorded as lost (``mark_node_lost``)."""
    names = (p.name[4:-5] for p in folder.glob("node*.lost"))
    return sorted(int(n) for n in names if n.isdigit())


def ended(folder: Path) -> dict[int, int]:
    """The ranks that ended the job on purpose, with the status each gave."""
    out = {}
    for p in folder.glob("rank*.ended"):
        with contextlib.suppress(OSError, ValueError):
            out[int(p.name[4:-6])] = int(p.read_text().strip())
    return out


def unfinished(folder: Path) -> list[int]:
    """The ranks that started and did not exit normally, from the markers in ``folder``.

    Ranks that ended the job on purpose (``ended``) are not among them.
    """
    started = {int(p.name[4:-8]) for p in folder.glob("rank*.started") if p.name[4:-8].isdigit()}
    exited = {int(p.name[4:-7]) for p in folder.glob("rank*.exited") if p.name[4:-7].isdigit()}
    return sorted(started - exited - set(ended(folder)))


def faults(folder: Path) -> dict[int, str]:
    """The ranks that died of a fatal signal: rank -> "Segmentation fault at f.py:12"."""
    out = {}
    for p in folder.glob("rank*.fault"):
        with contextlib.suppress(OSError, ValueError):
            text = p.read_text(errors="replace")
            if not text.strip():
                continue
            rank = int(p.name[4:-6])
            head = text.splitlines()[0].removeprefix("Fatal Python error: ").strip()
            lines = [line.strip() for line in text.splitlines()]
            frames = [line for line in lines if line.startswith("File ")]
            mine = [f for f in frames if not f.split('"')[1:2] or not _library(f.split('"')[1])]
            where = (mine or frames)[:1]  # the innermost frame of the program, not Python's
            out[rank] = f"{head} at {_frame(where[0])}" if where else head
    return out


def _library(path: str) -> bool:
    paths = sysconfig.get_paths()
    return path.startswith((paths["stdlib"], paths["purelib"], paths["platlib"]))


def _frame(line: str) -> str:
    # 'File "job.py", line 12 in main' -> 'job.py:12 in main'
    try:
        name, rest = line.split('"')[1], line.split('"', 2)[2]
        number = rest.split("line", 1)[1].split()[0]
        func = rest.split(" in ", 1)[1].strip() if " in " in rest else "?"
    except IndexError:
        return line
    return f"{name}:{number} in {func}"


class Departures:
    """When each rank of the job ended, as the launcher saw it (a context manager).

    Every rank that writes its start marker also connects to a Unix socket in the
    folder and says its number; the kernel closes the connection the moment the rank's
    process ends, however it ends, and a thread of the launcher notes the time.
    ``first(ranks)`` are those seen ending first: the rank that failed, when the MPI
    launcher then killed the rest (several when their ends arrived together). ``hello``
    holds when each rank said its number: its interpreter and MPI were up.
    """

    def __init__(self, folder: Path) -> None:
        self.when: dict[int, float] = {}  # rank -> when its process ended
        self.hello: dict[int, float] = {}  # rank -> when it said its number (it runs)
        self._path = folder / SOCKET
        self._server: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._watch, name="hpcpar-departures", daemon=True)

    def __enter__(self) -> Departures:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(str(self._path))
            server.listen(1024)
        except OSError:  # a folder path too long for a socket: no order is known
            server.close()
            return self
        self._server = server
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._wake_w.send(b"x")
            self._thread.join()
            self._server.close()
        self._wake_r.close()
        self._wake_w.close()

    def first(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` seen ending first; [] when none was seen (another host's)."""
        seen = {rank: self.when[rank] for rank in ranks if rank in self.when}
        earliest = min(seen.values(), default=None)
        return sorted(rank for rank, when in seen.items() if when == earliest)

    def _watch(self) -> None:
        assert self._server is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._server, selectors.EVENT_READ, "accept")
            sel.register(self._wake_r, selectors.EVENT_READ, "stop")
            while True:
                events = sel.select()
                now = time.monotonic()
                for key, _ in events:
                    if key.data == "stop":
                        for other in list(sel.get_map().values()):
                            if isinstance(other.data, bytearray):
                                other.fileobj.close()  # type: ignore[union-attr]
                        return
                    if key.data == "accept":
                        with contextlib.suppress(OSError):
                            conn, _ = self._server.accept()
                            sel.register(conn, selectors.EVENT_READ, bytearray())
                        continue
                    conn = key.fileobj
                    try:
                        data = conn.recv(64)  # type: ignore[union-attr]
                    except OSError:
                        data = b""
                    if data:
                        key.data.extend(data)
                        with contextlib.suppress(ValueError, IndexError):
                            if key.data.endswith(b"\n"):
                                self.hello.setdefault(int(bytes(key.data).split()[0]), now)
                        continue
                    sel.unregister(conn)
                    conn.close()  # type: ignore[union-attr]
                    with contextlib.suppress(ValueError):
                        self.when[int(bytes(key.data).split()[0])] = now
