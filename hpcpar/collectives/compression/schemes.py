"""The compression schemes: what each one sends, what it loses, and its encoder.

A scheme codes a float32 vector block by block (``kernels``) into one payload of bytes:
per block a 4-byte slot (scale or exponent), then the codes. Each scheme states its
error bound as a constant ``eps``: coding a vector changes element ``i`` by at most
``eps * M(i) + TINY``, where ``M(i)`` is the largest magnitude in ``i``'s block and
``TINY = 2^-120`` covers magnitudes at float32's floor (subnormals). A compressed
allreduce codes every node's sum once and the total once, so its result differs from
the exact sum by at most ``bound(p) * sum_k M_k(i) + 2 * TINY``, where ``M_k(i)`` is
node k's block maximum, ``bound(p) = 2 * eps + p * u``, ``u`` the accumulator's unit
roundoff (float32: 2^-24) and ``p`` the node count.

- ``fp16``: IEEE half of ``v 2^e`` per block; 2 + 4/block bytes per element;
  eps 2^-11 (nearest even).
- ``bf16``: bfloat16, no blocks; 2 bytes per element; eps 2^-8 (nearest even).
- ``int8``: ``rint(v 127 / max abs(v))`` per block; 1 + 4/block bytes per element;
  eps 1/254 (nearest), 1/127 (stochastic).
- ``1bit``: the sign bit, the block's mean ``abs(v)`` as its scale; 1/8 + 4/block bytes
  per element; eps 1 (meant for use with error feedback).

Non-finite inputs: a block holding a NaN or an infinity decodes to NaN in every
element (bf16: element by element, as IEEE); a compressed result is never finite where
an exact one would not be.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..errors import CollectiveError
from . import kernels

__all__ = ["Scheme", "Codec", "SCHEMES", "codec_for", "DEFAULT_BLOCK", "ROUNDINGS", "TINY"]

DEFAULT_BLOCK = 256
ROUNDINGS = ("nearest", "stochastic")
TINY = 2.0**-120  # absolute error at float32's floor, per coding
_SLACK = 2.0**-20  # float32 arithmetic inside the coder (the scale's own rounding)


@dataclass(frozen=True)
class Scheme:
    """One compression scheme.

    Attributes:
        name: As passed in ``compression=``.
        code_bits: Bits per element of the codes.
        blocked: Whether it sends a 4-byte slot per block.
        eps: Its error per coding, relative to the block's largest magnitude (nearest
            rounding; ``eps_stochastic`` for stochastic).
        summary: One line for ``explain`` and the docs.
    """

    name: str
    code_bits: int
    blocked: bool
    eps: float
    summary: str
    eps_stochastic: float | None = None

    def wire_bytes(self, count: int, block: int) -> int:
        """Payload bytes for ``count`` elements coded in blocks of ``block``."""
        if count <= 0:
            return 0
        slots = 4 * -(-count // block) if self.blocked else 0
        return slots + -(-count * self.code_bits // 8)

    def bound(self, nodes: int, stochastic: bool = False, accumulator: str = "float32") -> float:
        """The allreduce's error bound over ``nodes`` nodes (see the module docstring)."""
        eps = self.eps_stochastic if stochastic and self.eps_stochastic else self.eps
        u = 2.0**-24 if accumulator == "float32" else 2.0**-53
        return 2 * (eps + _SLACK) + max(nodes, 1) * u


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme("fp16", 16, True, 2.0**-11, "IEEE half with a power-of-two scale per block"),
        Scheme("bf16", 16, False, 2.0**-8, "bfloat16 (float32's range), no blocks"),
        Scheme("int8", 8, True, 1 / 254, "int8 with a max-|v| scale per block", 1 / 127),
        Scheme("1bit", 1, True, 1.0, "signs with a mean-|v| scale per block"),
    )
}


@dataclass(frozen=True)
class Codec:
    """A scheme with its block size and rounding: codes and decodes float32 vectors."""

    scheme: Scheme
    block: int = DEFAULT_BLOCK
    stochastic: bool = False

    @property
    def name(self) -> str:
        """The scheme's name."""
        return self.scheme.name

    def wire_bytes(self, count: int) -> int:
        """Payload bytes for ``count`` elements."""
        return self.scheme.wire_bytes(count, self.block)

    def _split(self, payload: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        slots = 4 * -(-count // self.block) if self.scheme.blocked else 0
        head, codes = payload[:slots], payload[slots : self.wire_bytes(count)]
        return head, codes

    def encode(
        self,
        v: np.ndarray,
        payload: np.ndarray,
        *,
        feedback: bool = False,
        seed: int = 0,
        start: int = 0,
    ) -> None:
        """Code float32 ``v`` into ``payload`` (uint8, ``wire_bytes(v.size)`` long).

        With ``feedback`` ``v`` is overwritten with what the code lost (``v - decoded``).
        ``seed`` and ``start`` (``v[0]``'s global index) drive stochastic rounding.
        """
        if v.dtype != np.float32 or not v.flags.c_contiguous:
            raise CollectiveError(f"the coders take contiguous float32 vectors, not {v.dtype}")
        n = v.size
        if n == 0:
            return
        head, codes = self._split(payload, n)
        bits = v.view(np.uint32)
        name = self.scheme.name
        if name == "int8":
            kernels.int8_encode(
                v,
                bits,
                head.view(np.float32),
                codes.view(np.int8),
                self.block,
                feedback,
                self.stochastic,
                np.uint64(seed & 0xFFFFFFFFFFFFFFFF),
                start,
            )
        elif name == "1bit":
            kernels.sign_encode(v, bits, head.view(np.float32), codes, self.block, feedback)
        elif name == "fp16":
            kernels.fp16_encode(
                v,
                bits,
                head.view(np.int32),
                codes.view(np.uint16),
                self.block,
                feedback,
                _scratch(2 * self.block),
            )
        else:
            kernels.bf16_encode(v, bits, codes.view(np.uint16), feedback, _scratch(self.block))

    def decode(self, payload: np.ndarray, acc: np.ndarray, *, add: bool = True) -> None:
        """``acc += decoded`` (or ``acc = decoded``), in ``acc``'s dtype."""
        n = acc.size
        if n == 0:
            return
        head, codes = self._split(payload, n)
        name = self.scheme.name
        if name == "int8":
            kernels.int8_decode(head.view(np.float32), codes.view(np.int8), acc, self.block, add)
        elif name == "1bit":
            kernels.sign_decode(head.view(np.float32), codes, acc, self.block, add)
        elif name == "fp16":
            kernels.fp16_decode(
                head.view(np.int32),
                codes.view(np.uint16),
                acc,
                self.block,
                add,
                _scratch(self.block),
            )
        elif not add and acc.dtype == np.float32 and acc.flags.c_contiguous:
            kernels.bf16_unpack(codes.view(np.uint16), acc.view(np.uint32))
        else:
            kernels.bf16_decode(codes.view(np.uint16), acc, add, _scratch(self.block))

    def bound(self, nodes: int, accumulator: str = "float32") -> float:
        """The allreduce's error bound over ``nodes`` nodes."""
        return self.scheme.bound(nodes, self.stochastic, accumulator)


_SCRATCH = threading.local()  # each thread its own: a gradient thread codes beside the program


def _scratch(n: int) -> np.ndarray:
    mine = _SCRATCH.__dict__
    buf = mine.get(n)
    if buf is None:
        buf = mine[n] = np.empty(n, np.float32)
    return buf


def codec_for(name: str, block: int = DEFAULT_BLOCK, rounding: str = "nearest") -> Codec:
    """The codec of scheme ``name``.

    Raises:
        CollectiveError: an unknown scheme or rounding, a block size that is not a
            positive integer (a multiple of 8 for 1bit), stochastic rounding of a scheme
            other than int8.
    """
    scheme = SCHEMES.get(name)
    if scheme is None:
        raise CollectiveError(
            f"unknown compression {name!r}; choose None, 'auto', {', '.join(map(repr, SCHEMES))}"
        )
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block <= 0:
        raise CollectiveError(f"compression block size must be a positive integer, not {block!r}")
    if name == "1bit" and block % 8:
        raise CollectiveError(
            f"1bit compression needs a block size that is a multiple of 8, not {block}"
        )
    if rounding not in ROUNDINGS:
        raise CollectiveError(f"rounding must be 'nearest' or 'stochastic', not {rounding!r}")
    if rounding == "stochastic" and name != "int8":
        raise CollectiveError(f"stochastic rounding applies to int8 only, not {name}")
    return Codec(scheme, int(block), rounding == "stochastic")
