"""The compiled loops of the compression schemes (numba; each block coded in cache).

Every scheme codes a float32 vector block by block into a payload of bytes: per block
a 4-byte slot (a float32 scale, or for fp16 an int32 power-of-two exponent), then the
codes. The loops run over one block's slices at a time, which numba vectorises, and
find a block's largest magnitude as the largest of its bit patterns with the sign bit
cleared (an integer maximum vectorises where a float maximum, with its NaN rules, does
not); a pattern at or above infinity's marks a block holding a NaN or an infinity.

With error feedback the caller adds the residual into ``v`` first; the encoder then
leaves in ``v`` what the code lost (the new residual), in the same pass. Decoding adds
into an accumulator of the caller's dtype (float32 or float64), never into the coded
type.

A block holding a NaN or an infinity decodes to NaN in every element (int8, 1bit,
fp16: its scale cannot be finite), so a non-finite input never comes out finite; its
residual is reset to zero so that one bad step does not poison the next ones. bf16 has
no blocks and keeps IEEE semantics element by element. A block whose largest magnitude
is below 2^-120 is sent as zeros by int8 and fp16 (its scale would overflow float32;
with error feedback it stays in the residual).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "int8_encode",
    "int8_decode",
    "sign_encode",
    "sign_decode",
    "fp16_encode",
    "fp16_decode",
    "bf16_encode",
    "bf16_decode",
    "bf16_unpack",
    "FP16_BAD",
]

# Fast-math without "nnan"/"ninf": non-finite values are detected from their bits.
_FAST = {"nsz", "arcp", "contract", "reassoc", "afn"}
_JIT = njit(nogil=True, cache=True, fastmath=_FAST)
_INLINE = njit(nogil=True, cache=True, fastmath=_FAST, inline="always")

FP16_BAD = np.int32(0x7FFFFFFF)  # the exponent slot of an fp16 block that held a non-finite value
_INF_BITS = np.uint32(0x7F800000)
_TINY_BITS = np.uint32(7 << 23)  # 2^-120: blocks below it are sent as zeros
_ABS = np.uint32(0x7FFFFFFF)
_SIGN = np.uint32(0x80000000)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_HALF_MAGIC = np.uint32(126 << 23)  # 0.5: adding it rounds a subnormal half's units
_HALF_NORMAL = np.uint32(113 << 23)  # 2^-14, half's smallest normal
_HALF_REBIAS = np.uint32((127 - 15) << 23)
# the eight signs (+1 for a set bit) of every byte: a sign code decodes by table lookup
_SIGNS = np.array([[1.0 if b >> j & 1 else -1.0 for j in range(8)] for b in range(256)], np.float32)


@_INLINE
def _absmax_bits(bits: np.ndarray) -> np.uint32:
    mb = np.uint32(0)
    for i in range(bits.size):
        mb = max(bits[i] & _ABS, mb)
    return mb


@_INLINE
def _from_bits(mb: np.uint32) -> float:
    """The float32 whose bit pattern is ``mb`` (finite, non-negative), as a float64."""
    e = np.int64(mb >> np.uint32(23))
    f = np.float64(mb & np.uint32(0x7FFFFF))
    if e == 0:
        return np.ldexp(f, -149)
    return np.ldexp(8388608.0 + f, e - 150)


@_INLINE
def _exponent(mb: np.uint32) -> int:
    """``frexp``'s exponent of the positive float32 whose bits are ``mb``: 2^(e-1) <= x < 2^e."""
    e = np.int64(mb >> np.uint32(23))
    if e > 0:
        return e - 126
    f = np.int64(mb)
    k = 0
    while f:
        f >>= 1
        k += 1
    return k - 149


@_INLINE
def _uniform(seed: np.uint64, index: np.int64) -> np.float32:
    """A uniform number in [0, 1) from (seed, element index): splitmix64's finaliser."""
    z = seed + np.uint64(index) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    z = z ^ (z >> np.uint64(31))
    return np.float32(z >> np.uint64(40)) * np.float32(1.0 / 16777216.0)


# ---- int8: blockwise absmax scale --------------------------------------------------------


@_JIT
def int8_encode(v, bits, scales, codes, block, feedback, stochastic, seed, start):
    """Code ``v`` as int8 with one float32 scale (max |v| / 127) per block.

    Nearest rounding is numpy's ``rint`` (ties to even). Stochastic rounding draws
    element i's number from (``seed``, ``start + i``): it does not depend on how a
    vector is cut. With ``feedback`` ``v`` is left holding ``v - decoded``.
    """
    n = v.size
    for b in range((n + block - 1) // block):
        lo = b * block
        hi = min(lo + block, n)
        vb = v[lo:hi]
        cb = codes[lo:hi]
        mb = _absmax_bits(bits[lo:hi])
        if mb >= _INF_BITS:
            scales[b] = np.nan
            cb[:] = 0
            if feedback:
                vb[:] = 0
            continue
        if mb < _TINY_BITS:  # 127 / max|v| would overflow float32
            scales[b] = 0.0
            cb[:] = 0
            continue
        m = _from_bits(mb)
        scale = np.float32(m / 127.0)
        scales[b] = scale
        inv = np.float32(127.0 / m)
        if stochastic:
            _int8_stochastic(vb, cb, inv, seed, start + lo)
        else:  # |v| inv <= 127 (1 + 2^-23): rint stays within [-127, 127]
            for i in range(vb.size):
                cb[i] = np.int8(np.rint(vb[i] * inv))
        if feedback:
            for i in range(vb.size):
                vb[i] -= cb[i] * scale


@_INLINE
def _int8_stochastic(vb, cb, inv, seed, first):
    for i in range(vb.size):
        q = np.floor(vb[i] * inv + _uniform(seed, first + i))
        cb[i] = np.int8(min(max(q, np.float32(-127.0)), np.float32(127.0)))


@_JIT
def int8_decode(scales, codes, acc, block, add):
    """``acc (+)= scale * code`` element by element, in ``acc``'s dtype."""
    n = acc.size
    for b in range((n + block - 1) // block):
        lo = b * block
        hi = min(lo + block, n)
        ab = acc[lo:hi]
        cb = codes[lo:hi]
        s = scales[b]
        if add:
            for i in range(ab.size):
                ab[i] += cb[i] * s
        else:
            for i in range(ab.size):
                ab[i] = cb[i] * s


# ---- 1bit: signs with the block's mean |v| -------------------------------------------------


@_JIT
def sign_encode(v, bits, scales, signs, block, feedback):
    """Code each element as its sign bit, each block's scale as its mean |v|.

    Bit 1 stands for a clear sign bit (+0.0 included). ``block`` is a multiple of 8;
    bit j of byte k is element 8k + j (``numpy.packbits(~numpy.signbit(v),
    bitorder="little")``). The mean |v| is the scale that minimises the squared error
    of a sign code.
    """
    n = v.size
    for b in range((n + block - 1) // block):
        lo = b * block
        hi = min(lo + block, n)
        vb = v[lo:hi]
        sb = signs[lo // 8 : (hi + 7) // 8]
        if _absmax_bits(bits[lo:hi]) >= _INF_BITS:
            scales[b] = np.nan
            sb[:] = 0
            if feedback:
                vb[:] = 0
            continue
        total = 0.0
        for i in range(vb.size):
            total += abs(vb[i])
        scale = np.float32(total / vb.size)
        scales[b] = scale
        bb = bits[lo:hi]
        for k in range(vb.size // 8):
            group = bb[8 * k : 8 * k + 8]
            byte = np.uint32(0)
            for j in range(8):
                byte |= ((~group[j]) >> np.uint32(31)) << np.uint32(j)
            sb[k] = np.uint8(byte)
        if vb.size % 8:  # the vector's last, partial byte
            byte = np.uint32(0)
            for j in range(vb.size - vb.size % 8, vb.size):
                byte |= ((~bb[j]) >> np.uint32(31)) << np.uint32(j % 8)
            sb[sb.size - 1] = np.uint8(byte)
        if feedback:
            _signs(sb, vb, scale, -1)


@_INLINE
def _signs(sb, out, scale, how):
    """``out (op)= scale * sign`` for the bits of ``sb``: how 0 sets, 1 adds, -1 subtracts."""
    whole = out.size // 8
    for k in range(whole):
        row = _SIGNS[sb[k]]
        if how == 0:
            for j in range(8):
                out[8 * k + j] = scale * row[j]
        elif how > 0:
            for j in range(8):
                out[8 * k + j] += scale * row[j]
        else:
            for j in range(8):
                out[8 * k + j] -= scale * row[j]
    if out.size % 8:
        row = _SIGNS[sb[whole]]
        for j in range(out.size % 8):
            x = scale * row[j]
            out[8 * whole + j] = x if how == 0 else out[8 * whole + j] + how * x


@_JIT
def sign_decode(scales, signs, acc, block, add):
    """``acc (+)= +-scale`` by each element's bit."""
    n = acc.size
    for b in range((n + block - 1) // block):
        lo = b * block
        hi = min(lo + block, n)
        ab = acc[lo:hi]
        sb = signs[lo // 8 : (hi + 7) // 8]
        _signs(sb, ab, scales[b], 1 if add else 0)


# ---- fp16: IEEE half with a power-of-two scale per block -------------------------------------


@_JIT
def fp16_encode(v, bits, exps, codes, block, feedback, scratch):
    """Code each block as half floats of ``v * 2^e``, ``e`` putting max |v| in [2^14, 2^15).

    The power of two is exact, so only the half rounding (to nearest even) loses
    (2^-11 of a value); the scale keeps every block inside half's range whatever its
    magnitude. ``scratch`` holds two float32 blocks.
    """
    n = v.size
    sf = scratch[:block]
    df = scratch[block : 2 * block]
    su = sf.view(np.uint32)
    du = df.view(np.uint32)
    for b in range((n + block - 1) // block):
        lo = b * block
        hi = min(lo + block, n)
        vb = v[lo:hi]
        bb = bits[lo:hi]
        cb = codes[lo:hi]
        mb = _absmax_bits(bb)
        if mb >= _INF_BITS:
            exps[b] = FP16_BAD
            cb[:] = 0
            if feedback:
                vb[:] = 0
            continue
        if mb < _TINY_BITS:  # 2^e would overflow float32
            exps[b] = 0
            cb[:] = 0
            continue
        e = 15 - _exponent(mb)
        exps[b] = e
        up = np.float32(np.ldexp(1.0, e))
        down = np.float32(np.ldexp(1.0, -e))
        k = vb.size
        for i in range(k):  # |v| 2^e, and the same plus 0.5 (rounds a subnormal's units)
            a = abs(vb[i]) * up
            sf[i] = a
            df[i] = a + np.float32(0.5)
        for i in range(k):  # Giesen's float-to-half, round to nearest even
            x = su[i]
            normal = (
                x - _HALF_REBIAS + np.uint32(0xFFF) + ((x >> np.uint32(13)) & np.uint32(1))
            ) >> np.uint32(13)
            sub = du[i] - _HALF_MAGIC
            h = sub if x < _HALF_NORMAL else normal
            cb[i] = np.uint16(h | ((bb[i] & _SIGN) >> np.uint32(16)))
        if feedback:
            _halves(cb, sf, down)
            for i in range(k):
                vb[i] -= sf[i]


@_INLINE
def _halves(cb: np.ndarray, sf: np.ndarray, down: np.float32) -> None:
    """``sf[:n] = half(cb) * down`` (Giesen's half-to-float; codes are finite)."""
    su = sf.view(np.uint32)
    k = cb.size
    for i in range(k):
        h = np.uint32(cb[i])
        o = ((h & np.uint32(0x7FFF)) << np.uint32(13)) + _HALF_REBIAS
        if (h & np.uint32(0x7C00)) == 0:
            o += np.uint32(1 << 23)
        su[i] = o
    for i in range(k):
        x = sf[i]
        if (cb[i] & np.uint16(0x7C00)) == 0:
            x -= np.float32(6.103515625e-05)  # 2^-14
        x *= down
        sf[i] = -x if cb[i] & np.uint16(0x8000) else x


@_JIT
def fp16_decode(exps, codes, acc, block, add, scratch):
    """``acc (+)= half(code) * 2^-e`` (NaN for a block marked non-finite)."""
    n = acc.size
    sf = scratch[:block]
    for b in range((n + block - 1) // block):
        lo = b * block
        hi = min(lo + block, n)
        ab = acc[lo:hi]
        if exps[b] == FP16_BAD:
            ab[:] = np.nan
            continue
        _halves(codes[lo:hi], sf, np.float32(np.ldexp(1.0, -exps[b])))
        if add:
            for i in range(ab.size):
                ab[i] += sf[i]
        else:
            for i in range(ab.size):
                ab[i] = sf[i]


# ---- bf16: the top half of a float32, rounded to nearest even -----------------------------


@_JIT
def bf16_encode(v, bits, codes, feedback, scratch):
    """Code each element as bfloat16 (float32's range, 8 significant bits; IEEE for inf/nan)."""
    n = v.size
    for i in range(n):
        u = bits[i]
        if (u & _ABS) > _INF_BITS:
            c = (u >> np.uint32(16)) | np.uint32(0x40)  # stays a quiet NaN
        else:
            c = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        codes[i] = np.uint16(c)
    if feedback:
        block = scratch.size
        for lo in range(0, n, block):
            hi = min(lo + block, n)
            _bf16s(codes[lo:hi], scratch)
            vb = v[lo:hi]
            bb = bits[lo:hi]
            for i in range(vb.size):
                vb[i] = vb[i] - scratch[i] if (bb[i] & _ABS) < _INF_BITS else np.float32(0.0)


@_INLINE
def _bf16s(cb: np.ndarray, sf: np.ndarray) -> None:
    """``sf[:n] = bf16(cb)`` (the code shifted into a float32's top half)."""
    su = sf.view(np.uint32)
    for i in range(cb.size):
        su[i] = np.uint32(cb[i]) << np.uint32(16)


@_JIT
def bf16_unpack(codes, out_bits):
    """``out = bf16(code)`` for a float32 ``out`` given as its bits: one integer pass."""
    for i in range(codes.size):
        out_bits[i] = np.uint32(codes[i]) << np.uint32(16)


@_JIT
def bf16_decode(codes, acc, add, scratch):
    """``acc (+)= bf16(code)``."""
    n = acc.size
    block = scratch.size
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        ab = acc[lo:hi]
        _bf16s(codes[lo:hi], scratch)
        if add:
            for i in range(ab.size):
                ab[i] += scratch[i]
        else:
            for i in range(ab.size):
                ab[i] = scratch[i]
