"""Halo exchange for N-dimensional domain decompositions on a Cartesian communicator.

Dimension by dimension, each rank sends the ``width`` interior layers next to each face
to the neighbour on that side and receives that neighbour's layers into its halo. The
faces of later dimensions span the halos already filled, so edges and corners arrive
too (periodic or not; at a non-periodic boundary the halo is left as it was). Face
plans are built once; each exchange packs into preallocated buffers.

Arrays may also be GPU arrays (cupy, or anything with the CUDA array interface): each
face then travels through host memory as ``hpcpar.send`` moves it, staged by one 2D
copy where the face is one strided run, else packed by the kernel on the device
(``datatypes.choose.device_send_method``), and arrives the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .collectives.buffers import is_device_array
from .datatypes import DatatypeError, plan
from .errors import HpcparError

__all__ = ["HaloExchange"]


class HaloExchange:
    """Exchange the halos of arrays shaped ``local_shape + 2 * width`` per dimension.

    Args:
        cart_comm: A Cartesian communicator with one dimension per array dimension.
        local_shape: The interior cells this rank owns.
        width: Halo layers, one number or one per dimension.
        dtype: The arrays' dtype.
    """

    def __init__(
        self, cart_comm: Any, local_shape: tuple[int, ...], width: int | tuple[int, ...], dtype: Any
    ) -> None:
        if not isinstance(cart_comm, MPI.Cartcomm):
            raise HpcparError("HaloExchange needs a Cartesian communicator (comm.Create_cart)")
        self.ndim = len(local_shape)
        if cart_comm.Get_dim() != self.ndim:
            raise HpcparError(
                f"the communicator has {cart_comm.Get_dim()} dimensions, the domain {self.ndim}"
            )
        widths = (width,) * self.ndim if isinstance(width, int) else tuple(width)
        if len(widths) != self.ndim or any(w < 0 for w in widths):
            raise HpcparError(
                f"width must be one or {self.ndim} non-negative numbers, not {width!r}"
            )
        if any(w > n for w, n in zip(widths, local_shape, strict=True)):
            raise HpcparError(
                f"halo width {widths} is wider than the local domain {tuple(local_shape)}"
            )
        self.comm = cart_comm.Dup()  # halo traffic never matches the caller's messages
        self.local_shape = tuple(local_shape)
        self.widths = widths
        self.dtype = np.dtype(dtype)
        self.shape = tuple(n + 2 * w for n, w in zip(local_shape, widths, strict=True))
        self._steps = [self._step(d) for d in range(self.ndim) if widths[d]]
        self._device_methods: dict[tuple[int, ...], list[str]] = {}  # GPU arrays' strides

    def _region(self, d: int, side: int, halo: bool) -> tuple[slice, ...]:
        n, w = self.local_shape[d], self.widths[d]
        if halo:
            cut = slice(0, w) if side < 0 else slice(n + w, n + 2 * w)
        else:
            cut = slice(w, 2 * w) if side < 0 else slice(n, n + w)
        return tuple(cut if k == d else slice(None) for k in range(self.ndim))

    def _step(self, d: int) -> list[tuple[Any, ...]]:
        low, high = self.comm.Shift(d, 1)
        template = np.empty(self.shape, self.dtype)
        moves = []
        for side, towards, away in ((-1, low, high), (1, high, low)):
            send_at, recv_at = self._region(d, side, False), self._region(d, -side, True)
            face = plan(template[send_at])  # a face's plan: its bytes, in pack order
            shape = template[send_at].shape
            outgoing = np.empty(face.size, np.uint8).view(self.dtype).reshape(shape)
            incoming = np.empty(face.size, np.uint8).view(self.dtype).reshape(shape)
            moves.append((send_at, recv_at, towards, away, outgoing, incoming))
        return moves

    def exchange(self, a: Any) -> Any:
        """Fill ``a``'s halos from the neighbours (collective over the communicator).

        ``a``: a numpy array or a GPU array of the shape and dtype given at construction.
        """
        if tuple(a.shape) != self.shape or np.dtype(a.dtype) != self.dtype:
            raise DatatypeError(f"expected an array of shape {self.shape} and dtype {self.dtype}")
        if is_device_array(a):
            return self._exchange_device(a)
        tag = 0
        for moves in self._steps:
            for send_at, recv_at, to, frm, outgoing, incoming in moves:
                np.copyto(outgoing, a[send_at])  # the face's strided copy into its packed buffer
                self.comm.Sendrecv(outgoing, to, tag, incoming, frm, tag)
                if frm != MPI.PROC_NULL:
                    np.copyto(a[recv_at], incoming)
                tag += 1
        return a

    def _exchange_device(self, a: Any) -> Any:
        from .datatypes.choose import device_send_method
        from .datatypes.gpu import device_to_host, host_to_device, require_cupy

        require_cupy(a)
        moves = [move for step in self._steps for move in step]
        strides = tuple(a.strides)  # a face's method depends only on its layout: choose once
        if strides not in self._device_methods:
            self._device_methods[strides] = [
                device_send_method(plan(a[move[0]]))[0] for move in moves
            ]
        for tag, (move, method) in enumerate(
            zip(moves, self._device_methods[strides], strict=True)
        ):
            send_at, recv_at, to, frm, _, incoming = move
            face = a[send_at]
            outgoing = device_to_host(face, method) if to != MPI.PROC_NULL else incoming
            self.comm.Sendrecv(outgoing, to, tag, incoming, frm, tag)
            if frm != MPI.PROC_NULL:
                host_to_device(incoming.reshape(-1).view(np.uint8), a[recv_at], method)
        return a

    def free(self) -> None:
        """Free the private communicator."""
        self.comm.Free()
