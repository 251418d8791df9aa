"""What a rank's thread is doing: whether it waits in a call, and where the user's code is."""

from __future__ import annotations

import contextlib
import importlib.util
import linecache
import os
import queue
import re
import sys
import sysconfig
import threading
import traceback
from typing import Any

__all__ = ["blocked_in", "user_frame", "stack_text", "frame_text"]

_HERE = os.path.dirname(os.path.abspath(__file__))  # the watchdog's own package
_HPCPAR = os.path.dirname(os.path.dirname(_HERE))
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
    if path.startswith(_ours()) and not path.startswith(_HERE + os.sep):
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


def user_frame(frame: Any) -> Any:
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
    return outer if outer is not None and not starts_the_script(outer) else frame


def starts_the_script(frame: Any) -> bool:
    """Whether ``frame`` is only the program's start (runpy, ``hpcpar.run``)."""
    name = frame.f_code.co_filename
    return name.startswith("<frozen ") or name.endswith(os.path.join("hpcpar", "run.py"))


def stack_text(frame: Any) -> str:
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


def frame_text(frame: Any) -> str:
    """``file:line in function`` of ``frame``."""
    if frame is None:
        return "unknown"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
