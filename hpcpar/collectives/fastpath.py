"""The MPI library's blocking allreduce with as little Python as possible.

``hpcpar.allreduce`` tries this first: numpy arrays, a predefined op on a native dtype,
the ``mpi`` algorithm (or ``auto`` choosing it), no argument checks. Each piece of the
decision is a dictionary lookup; anything else goes to the general path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..runtime.env import getenv_fast
from . import mpi_library
from .channel import note_library_call
from .check import checking
from .select import choose
from .state import fast_state

__all__ = ["fast_allreduce"]

_AUTO_ENV = (b"HPCPAR_ALGORITHM_ALLREDUCE", b"HPCPAR_RULES", b"HPCPAR_PROFILE")


def fast_allreduce(x: Any, op: Any, out: Any, comm: Any, algorithm: str) -> Any:
    """The MPI library's blocking Allreduce with as little Python as possible, or None.

    Taken only when the general path would do exactly this: numpy arrays, a predefined
    op on a native dtype, the ``mpi`` algorithm, no checks. It still takes a tag from
    the sequence, so every rank's sequence stays the same whichever path it took.
    """
    state = fast_state(comm)
    if state is None or type(x) is not np.ndarray or not isinstance(op, MPI.Op) or checking():
        return None
    if algorithm == "auto":
        # auto's choice depends on the size, the element size and three variables
        # (read on every call, so changing one takes effect at once); remember it.
        key = (x.nbytes, x.itemsize, getenv_fast("", _AUTO_ENV[0]),
               getenv_fast("", _AUTO_ENV[1]), getenv_fast("", _AUTO_ENV[2]))  # fmt: skip
        use_mpi = state.fast_auto.get(key)
        if use_mpi is None:
            use_mpi = choose("allreduce", "auto", None, state, x.nbytes, x.itemsize)[0].name
            use_mpi = state.fast_auto[key] = use_mpi == "mpi"
            if len(state.fast_auto) > 4096:  # a program sweeping every size
                state.fast_auto.clear()
        if not use_mpi:
            return None
    elif algorithm != "mpi":
        return None
    mpi_op = mpi_library.native_mpi_op(op, x.dtype)
    if mpi_op is None or not x.flags.c_contiguous:
        return None
    if out is None:
        out = np.empty_like(x)
    usable = type(out) is np.ndarray and out.shape == x.shape and out.dtype == x.dtype
    if not (usable and out.flags.c_contiguous and out.flags.writeable):
        return None
    state.next_tag()
    mpi_library.blocking_allreduce(state.private, x, out, mpi_op)
    note_library_call("allreduce", x.nbytes)
    return out
