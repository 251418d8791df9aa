"""Halo exchange for N-dimensional domain decompositions on a Cartesian communicator.

Dimension by dimension, each rank sends the ``width`` interior layers next to each face
to the neighbour on that side and receives that neighbour's layers into its halo. The
faces of later dimensions span the halos already filled, so edges and corners arrive too
(periodic or not; at a non-periodic boundary the halo is left as it was). Face plans are
built once. Along a periodic dimension of one rank the halo is the rank's own opposite
face: copied in place, without MPI. A face that is one contiguous block (the first
dimension's, in a C-ordered array) is sent from the array and received into it, with no
copy; any other goes as ``hpcpar.send`` would send it
(``datatypes.choose.send_method``): packed into a preallocated buffer, or as an MPI
datatype made once for its layout.

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
from .datatypes.choose import send_method
from .errors import HpcparError
from .p2p.buffers import view_type
from .runtime import flight

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
        # host exchanges pack every face through one pair of buffers (the messages go one
        # at a time): a buffer per face made the exchange 10-20% slower than hand-written
        # code at 96^3, its twelve buffers crowding the array out of the cache
        largest = max((move[4].nbytes for step in self._steps for move in step), default=0)
        sending, landing = np.empty(largest, np.uint8), np.empty(largest, np.uint8)
        self._host_steps = [
            [
                (*move[:4], _shaped(sending, move[4]), _shaped(landing, move[4]), move[5])
                for move in step
            ]
            for step in self._steps
        ]
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
            # where a GPU array's face lands in host memory (host arrays share one pair)
            incoming = np.empty(face.size, np.uint8).view(self.dtype).reshape(shape)
            ways = (self._way(template, send_at, face), self._way(template, recv_at, face))
            moves.append((send_at, recv_at, towards, away, incoming, ways))
        return moves

    @staticmethod
    def _way(template: np.ndarray, region: tuple[slice, ...], face: Any) -> Any:
        """How a face of a C-ordered host array moves.

        ``"whole"`` (one contiguous block), ``(type, first byte, last byte + 1)`` (an MPI
        datatype), or None (packed).
        """
        view = template[region]
        if view.flags.c_contiguous:
            return "whole"
        if send_method(face)[0] != "datatype":
            return None
        dt, lo, hi = view_type(face)
        start = view.__array_interface__["data"][0] - template.__array_interface__["data"][0]
        return dt, start + lo, start + hi

    def exchange(self, a: Any) -> Any:
        """Fill ``a``'s halos from the neighbours (collective over the communicator).

        ``a``: a numpy array or a GPU array of the shape and dtype given at construction.
        """
        if tuple(a.shape) != self.shape or np.dtype(a.dtype) != self.dtype:
            raise DatatypeError(f"expected an array of shape {self.shape} and dtype {self.dtype}")
        entry = flight.point("halo exchange", "halo", None, a)
        try:
            if is_device_array(a):
                return self._exchange_device(a)
            return self._exchange_host(a)
        finally:
            flight.leave(entry)

    def _exchange_host(self, a: Any) -> Any:
        flat = a.reshape(-1).view(np.uint8) if a.flags.c_contiguous else None
        me = self.comm.Get_rank()
        tag = 0
        for moves in self._host_steps:
            for send_at, recv_at, to, frm, outgoing, incoming, (out_way, in_way) in moves:
                if to == frm == me:  # periodic over one rank: the halo is this rank's own face
                    np.copyto(a[recv_at], a[send_at])
                    tag += 1
                    continue
                sending = _message(a, flat, send_at, out_way)
                if sending is None:  # the face's strided copy into its packed buffer
                    np.copyto(outgoing, a[send_at])
                    sending = outgoing
                landing = _message(a, flat, recv_at, in_way)
                self.comm.Sendrecv(
                    sending, to, tag, incoming if landing is None else landing, frm, tag
                )
                if landing is None and frm != MPI.PROC_NULL:
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
            send_at, recv_at, to, frm, incoming, _ = move
            face = a[send_at]
            outgoing = device_to_host(face, method) if to != MPI.PROC_NULL else incoming
            self.comm.Sendrecv(outgoing, to, tag, incoming, frm, tag)
            if frm != MPI.PROC_NULL:
                host_to_device(incoming.reshape(-1).view(np.uint8), a[recv_at], method)
        return a

    def free(self) -> None:
        """Free the private communicator."""
        self.comm.Free()


def _message(a: np.ndarray, flat: np.ndarray | None, region: tuple[slice, ...], way: Any) -> Any:
    """The face ``a[region]`` as an MPI message with no copy, or None (pack it)."""
    if flat is None or way is None:
        return None
    if way == "whole":
        return a[region]
    dt, lo, hi = way
    return [flat[lo:hi], 1, dt]


def _shaped(buffer: np.ndarray, like: np.ndarray) -> np.ndarray:
    """The first bytes of ``buffer`` as an array of ``like``'s shape and dtype."""
    return buffer[: like.nbytes].view(like.dtype).reshape(like.shape)
