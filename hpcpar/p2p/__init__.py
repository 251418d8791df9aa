"""Point-to-point on any layout: non-contiguous numpy views and MPI datatypes.

Contiguous arrays go to MPI as they are (mpi4py refuses non-contiguous views outright).
Anything else goes one of two ways (``method``; ``datatypes.choose.send_method`` picks
from the measured table): packed with its plan into a contiguous buffer (and unpacked
on arrival), or zero copy as hpcpar's own MPI datatype of the layout, made once per
layout and built the way the MPI library walks fastest (``Plan.to_mpi``), also in
place of a caller's datatype. ``send_init``/``recv_init`` do all of that once and
leave each step the copy and MPI's persistent request. GPU arrays (cupy, or anything with
the CUDA array interface; any layout) travel through host memory, packed on the device
or staged by a 2D copy (``method``; see ``datatypes.choose``). With ``comm=None`` the
messages use hpcpar's own communicator, so both sides must use hpcpar; pass a
communicator to talk to code that calls mpi4py directly (the bytes on the wire are the
packed data).
"""

from __future__ import annotations

from .calls import P2PRequest, irecv, isend, recv, send, sendrecv
from .persistent import PersistentRequest, recv_init, send_init

__all__ = [
    "send",
    "recv",
    "isend",
    "irecv",
    "sendrecv",
    "send_init",
    "recv_init",
    "P2PRequest",
    "PersistentRequest",
]
