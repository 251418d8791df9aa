"""Persistent allreduce: ``hpcpar.allreduce_init`` binds the buffers and the algorithm once.

For loops that reduce the same buffers again and again (an iterative solver's dot
products). Where ``auto`` picks the MPI library's call, each call is the library's
persistent ``MPI_Allreduce_init`` request started and waited, or its blocking call,
whichever measured faster when the call was made (MPI libraries may run persistent
collectives with other algorithms than the blocking ones, faster at some sizes and
slower at others; ``hpcpar bench collectives`` has both as variants); no selection runs
per call. Any other algorithm runs as ``iallreduce`` of the bound buffers.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from mpi4py import MPI

from ..runtime import flight
from ..runtime.flight import CALLS, SEQ
from ..runtime.orphans import adopt
from ..runtime.switches import HOT
from . import mpi_library
from .api import iallreduce
from .autotune import measure_calls
from .buffers import check_out, host_array
from .channel import note_library_call
from .errors import CollectiveError
from .ops import resolve_op
from .registry import LIBRARY
from .schedule import PendingRequestWarning
from .select import choose
from .state import state_for

__all__ = ["PERSISTENT_PROBE_BYTES", "PersistentAllreduce", "allreduce_init"]

PERSISTENT_PROBE_BYTES = 1 << 20  # above: the blocking call, whose Python cost is lost
PERSISTENT_MARGIN = 0.05  # the persistent request is kept only when 5% faster


class PersistentAllreduce:
    """An allreduce bound to its buffers and its algorithm (``allreduce_init``).

    ``start()`` then ``wait()`` (or a call, both) as often as wanted; ``x`` may be
    changed between calls, never between ``start()`` and ``wait()``. ``free()`` (or a
    ``with`` block) releases it. ``algorithm`` and ``reason`` say what was chosen.
    """

    def __init__(self, x: Any, op: Any, out: Any, comm: Any, algorithm: str) -> None:
        state = state_for(comm)
        data = host_array(x)
        rop = resolve_op(op, data.dtype)
        if out is None:
            out = np.empty_like(x)
        else:
            check_out(out, tuple(data.shape), data.dtype)
        chosen, self.reason = choose("allreduce", algorithm, rop, state, data.nbytes, data.itemsize)
        self.algorithm = chosen.name
        self.x, self.out, self._op, self._comm, self._state = x, out, op, comm, state
        self._entry: Any = None  # its flight-record entry (a run of starts)
        self._running: Any = None
        self._freed = False
        self._request: Any = None
        self._mpi_op = (
            mpi_library.native_mpi_op(op, data.dtype)
            if (
                chosen.name == LIBRARY
                and type(x) is np.ndarray
                and type(out) is np.ndarray
                and x.flags.c_contiguous
                and out.flags.c_contiguous
            )
            else None
        )
        self._library = self._mpi_op is not None
        if self._library:  # bound: the library's persistent request or its blocking call
            self._request = self._faster_library_call()

    def start(self) -> None:
        """Begin one allreduce of ``x`` into ``out`` (collective)."""
        if self._freed:
            raise CollectiveError("persistent allreduce: used after free()")
        if self._running is not None:
            raise CollectiveError("persistent allreduce: start() again before wait()")
        if not self._library:
            self._running = iallreduce(
                self.x, self._op, out=self.out, comm=self._comm, algorithm=self.algorithm
            )
            return
        seq = self._state._sequence
        self._state.next_tag()  # the same tag sequence as a plain call
        if HOT.recording:
            self._record(seq)
        if self._request is not None:
            self._request.Start()
        else:
            self._blocking()
        self._running = True

    def _record(self, seq: int) -> None:
        """The flight record: successive starts of this allreduce are one entry."""
        entry = self._entry
        if (
            not flight.TRACING
            and entry is not None
            and HOT.last_entry is entry
            and entry[SEQ] + entry[CALLS] == seq
        ):
            entry[CALLS] += 1
            HOT.current = entry
            return
        self._entry = flight.enter(
            self._state.label,
            seq,
            "allreduce (persistent)",
            LIBRARY,
            self.x.size,
            self.x.dtype,
            self._op,
            None,
            depth=2,
        )

    def wait(self) -> Any:
        """Finish the allreduce ``start()`` began; returns ``out``."""
        if self._running is None:
            raise CollectiveError("persistent allreduce: wait() without start()")
        running, self._running = self._running, None
        if not self._library:
            return running.wait()
        if self._request is not None:
            HOT.current = self._entry
            self._request.Wait()
        flight.finish(self._entry)
        note_library_call("allreduce", self.out.nbytes)
        return self.out

    def __call__(self) -> Any:
        """``start()`` and ``wait()``: one blocking allreduce; returns ``out``."""
        self.start()
        return self.wait()

    def _blocking(self) -> None:
        mpi_library.blocking_allreduce(self._state.private, self.x, self.out, self._mpi_op)

    def _faster_library_call(self) -> Any:
        """The library's persistent request, or None for its blocking call (collective).

        Up to ``PERSISTENT_PROBE_BYTES`` both are timed on the bound buffers as autotuning
        times candidates (``measure_calls``: ``out`` is overwritten; in place, ``x`` is
        restored); above, the blocking call.
        """
        x, out = self.x, self.out
        if x.nbytes > PERSISTENT_PROBE_BYTES:
            self.reason += "; bound to the library's blocking call"
            return None
        saved = x.copy() if out is x else None
        send = MPI.IN_PLACE if out is x else x
        request = self._state.private.Allreduce_init(send, out, self._mpi_op)

        def persistent() -> None:
            request.Start()
            request.Wait()

        # twice each, in turn, so a slow spell of a shared machine does not decide alone
        persistent_s = blocking_s = float("inf")
        for _ in range(2):
            persistent_s = min(persistent_s, measure_calls(self._state, "p", persistent))
            blocking_s = min(blocking_s, measure_calls(self._state, "b", self._blocking))
        if saved is not None:
            np.copyto(x, saved)
        # the blocking call is what every other path uses: the request must beat it clearly
        use = persistent_s < (1 - PERSISTENT_MARGIN) * blocking_s
        kept = "persistent request" if use else "blocking call"
        self.reason += (
            f"; bound to the library's {kept} (persistent {persistent_s * 1e6:.1f}"
            f" us, blocking {blocking_s * 1e6:.1f} us per call)"
        )
        if use:
            return request
        request.Free()
        return None

    def free(self) -> None:
        """Release the persistent request (after its last ``wait()``)."""
        if self._running is not None:
            raise CollectiveError("persistent allreduce: free() before wait()")
        if self._request is not None and not self._freed:
            self._request.Free()
        self._freed = True

    def progress(self) -> bool:
        """Finish a started call without blocking once it is done, then release it."""
        if not self._request.Test():  # completes it: the wait below returns at once
            return False
        self.wait()
        self.free()
        return True

    def describe(self) -> str:
        """What it is, for warnings."""
        return f"persistent allreduce of {self.out.nbytes} bytes"

    def __del__(self) -> None:
        # only the library's persistent request can be in flight here: an iallreduce in
        # flight is a CollectiveRequest, which looks after itself when dropped
        if getattr(self, "_running", None) is not True or self._request is None:
            return
        adopt(self)  # kept alive (resurrected) with x and out until the call completes
        warnings.warn(
            f"hpcpar: {self.describe()} dropped between start() and wait(); "
            "hpcpar completes it in the background",
            PendingRequestWarning,
            stacklevel=2,
        )

    def __enter__(self) -> PersistentAllreduce:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._running is not None:
            self.wait()
        self.free()


def allreduce_init(
    x: Any, op: Any = MPI.SUM, *, out: Any = None, comm: Any = None, algorithm: str = "auto"
) -> PersistentAllreduce:
    """A persistent allreduce of ``x`` into ``out``: the algorithm is chosen once (collective).

    See the module docstring. Where the library's call is chosen and ``x`` is at most
    ``PERSISTENT_PROBE_BYTES``, ``init`` times the persistent request and the blocking call
    on the bound buffers (a few dozen calls: ``out`` is overwritten; in place, ``x`` is
    restored).
    """
    return PersistentAllreduce(x, op, out, comm, algorithm)
