"""This rank's share of the node's cores, and the helper threads large copies run on.

A copy from ``PARALLEL_BYTES`` is cut into parts, one per core of this rank's share
(``copy_threads``); the calling thread copies the first part and helper threads, which
poll for work for a moment after each part, copy the rest (``run_parts``). Every copy
a part runs (numpy's, numba's nogil loops) lets the GIL go.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from typing import Any

import numpy as np

from ..runtime import settings
from ..runtime.env import usable_cores

__all__ = ["PARALLEL_BYTES", "copy_array", "parallel_copy", "run_parts"]

PARALLEL_BYTES = 4 << 20  # copies this large are split across threads (all drop the GIL)
_pool: list[Any] = []


_LOCAL_RANKS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE")


def local_ranks() -> int:
    """The ranks the launcher says share this node (Hydra, Open MPI, PMI), else 1."""
    return next(
        (int(v) for v in map(os.environ.get, _LOCAL_RANKS) if v and v.isdigit() and int(v) >= 1), 1
    )


_thread_count: list[int] = []


def copy_threads() -> int:
    """Threads for one large copy: this rank's share of the node's cores (1 to 8).

    ``HPCPAR_COPY_THREADS`` sets it; otherwise the cores this process may run on,
    divided by the ranks the launcher says share its node (Hydra's ``MPI_LOCALNRANKS``,
    Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``), so ranks that share cores do not each
    start a thread per core. Read once.
    """
    if not _thread_count:
        count = settings.value("HPCPAR_COPY_THREADS") or max(1, usable_cores() // local_ranks())
        _thread_count.append(min(count, 8))
    return _thread_count[0]


def copy_array(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)``; contiguous copies from ``PARALLEL_BYTES`` split over the cores.

    One thread copies at about half the machine's memory bandwidth; the checkpoint
    snapshot, which the caller waits for, uses every core.
    """
    if (
        dst.nbytes < PARALLEL_BYTES
        or copy_threads() < 2
        or dst.shape != src.shape
        or dst.dtype != src.dtype
        or dst.dtype.hasobject
        or not (dst.flags.c_contiguous and src.flags.c_contiguous)
    ):
        np.copyto(dst, src)
        return
    flat_dst, flat_src = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    cuts = [
        min(flat_dst.size, (flat_dst.size * i // copy_threads()) // 64 * 64)
        for i in range(copy_threads())
    ] + [flat_dst.size]
    _on_threads(np.copyto, flat_dst, flat_src, cuts)


def parallel_copy(dst: np.ndarray, src: np.ndarray, copy: Any = np.copyto) -> None:
    """Copy in slices of the outermost dimension, one per core."""
    bounds = np.linspace(0, dst.shape[0], min(copy_threads(), dst.shape[0]) + 1).astype(int)
    _on_threads(copy, dst, src, bounds)


def _on_threads(copy: Any, dst: np.ndarray, src: np.ndarray, cuts: Any) -> None:
    """``copy(dst[a:b], src[a:b])`` per cut: the first on this thread, the rest on helpers."""
    run_parts([(copy, dst[a:b], src[a:b]) for a, b in itertools.pairwise(cuts) if b > a])


def run_parts(parts: list[tuple[Any, np.ndarray, np.ndarray]]) -> None:
    """``copy(dst, src)`` for each part: the first on this thread, the rest on helpers.

    A helper's failure is raised here, after every part has finished.
    """
    if not parts:
        return
    if len(parts) > 1 and not _pool:
        _pool.extend(_Helper() for _ in range(max(1, copy_threads() - 1)))
    done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
    for k, (copy, dst, src) in enumerate(parts[1:]):
        _pool[k % len(_pool)].jobs.put((copy, dst, src, done))
    try:
        copy, dst, src = parts[0]
        copy(dst, src)
    finally:
        failures = [done.get() for _ in parts[1:]]
    for failure in failures:
        if failure is not None:
            raise failure


SPIN_SECONDS = 0.002  # how long a helper keeps polling for the next job after one


class _Helper:
    """A copy thread that polls for its next job for ``SPIN_SECONDS`` after each one.

    A thread that blocks waits for its (virtual) CPU to wake, which on a VM costs a
    sizeable share of a large copy; so, as OpenMP's threads spin before they sleep, a
    helper polls (``time.sleep(0)``, which lets the GIL go) while the next job is
    likely, and blocks between bursts. ``time.sleep(0)`` itself may sleep for the
    kernel's timer slack, so a job can wait that long to be picked up; a spin in
    compiled code picks small jobs up sooner but moved large copies no faster, so it
    is not used. ``hpcpar bench datatypes`` measures the threaded copies.
    """

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="hpcpar-pack", daemon=True).start()

    def _serve(self) -> None:
        until = 0.0
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                if time.perf_counter() < until:
                    time.sleep(0)
                    continue
                job = self.jobs.get()
            copy, dst, src, done = job
            try:
                copy(dst, src)
            except BaseException as exc:  # handed back to the caller, who raises it
                done.put(exc)
            else:
                done.put(None)
            del job, dst, src  # hold no buffers while waiting
            until = time.perf_counter() + SPIN_SECONDS


if hasattr(os, "register_at_fork"):  # a forked child has none of these threads
    os.register_at_fork(after_in_child=_pool.clear)
