"""Packing plans on the GPU (cupy): a raw CUDA kernel, or cudaMemcpy2D into pinned memory.

The kernel follows TEMPI: every thread moves one W-byte word (the widest that divides
the block, the strides and the addresses) of one block, so a face of a 3D array is one
launch whatever its nesting; irregular layouts (many small kernels, ``blocks.py``) are
one ``block_copy`` launch over all their blocks, cut to one length, instead of a launch
per kernel (thousands for a scattered indexed type). For layouts with one strided
dimension, a single
``cudaMemcpy2DAsync`` copies straight into pinned host memory (device to host staging
with no intermediate device buffer). Both need cupy and a GPU; the tests skip with that
reason elsewhere.

Point-to-point (``hpcpar.send`` and the rest) moves a GPU array's packed bytes through
host memory (the MPI library from PyPI is not CUDA-aware): ``device_to_host`` /
``host_to_device`` by either method, ``staged`` (the 2D copy, straight between the
view and host memory) or ``device`` (the kernel into a device buffer, one copy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DatatypeError
from .kernels import Kernel, device_word
from .plan import Plan

__all__ = [
    "pack_device",
    "unpack_device",
    "pack_to_host",
    "unpack_from_host",
    "device_to_host",
    "host_to_device",
    "gpu_available",
]

_SOURCE = r"""
template<typename T>
__global__ void strided_copy(unsigned char* user, unsigned char* packed,
                             const long long* counts, const long long* ustr,
                             const long long* pstr, int ndims, long long nwords,
                             long long total, long long user0, long long packed0,
                             int pack) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    long long word = i % nwords, rest = i / nwords;
    long long u = user0 + word * (long long)sizeof(T), p = packed0 + word * (long long)sizeof(T);
    for (int d = ndims - 1; d >= 0; --d) {
        long long k = rest % counts[d];
        rest /= counts[d];
        u += k * ustr[d];
        p += k * pstr[d];
    }
    if (pack) *(T*)(packed + p) = *(const T*)(user + u);
    else *(T*)(user + u) = *(const T*)(packed + p);
}

template<typename T>
__global__ void block_copy(unsigned char* user, unsigned char* packed, const long long* at,
                           long long nblocks, long long nwords, long long total,
                           long long user0, long long step, int pack) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    long long word = i % nwords, block = i / nwords;
    long long u = user0 + (block / nblocks) * step + at[block % nblocks]
                  + word * (long long)sizeof(T);
    long long p = i * (long long)sizeof(T);
    if (pack) *(T*)(packed + p) = *(const T*)(user + u);
    else *(T*)(user + u) = *(const T*)(packed + p);
}
"""
_NAMES = {
    8: "strided_copy<unsigned long long>",
    4: "strided_copy<unsigned int>",
    2: "strided_copy<unsigned short>",
    1: "strided_copy<unsigned char>",
}
_BLOCK_NAMES = {w: name.replace("strided_copy", "block_copy") for w, name in _NAMES.items()}
_module: list[Any] = []


def _kernel(width: int, blocks: bool = False) -> Any:
    import cupy

    if not _module:
        names = [*_NAMES.values(), *_BLOCK_NAMES.values()]
        _module.append(
            cupy.RawModule(code=_SOURCE, options=("-std=c++11",), name_expressions=names)
        )
    return _module[0].get_function((_BLOCK_NAMES if blocks else _NAMES)[width])


def _device_dims(p: Plan, count: int) -> list[tuple[Kernel, tuple[Any, Any, Any]]]:
    """The plan's kernels with their counts and strides in device memory, made once.

    Three host-to-device copies per kernel and call would cost more than a small pack
    itself, so they are kept on the plan (per device and count).
    """
    import cupy

    key = ("device dims", cupy.cuda.runtime.getDevice(), count)
    if key not in p._memo:
        p._memo[key] = [
            (
                k,
                tuple(
                    cupy.asarray([dim[i] for dim in k.dims] or [1 if i == 0 else 0], cupy.int64)
                    for i in range(3)
                ),
            )
            for k in p._kernels(count)
            if k.size and all(c for c, _, _ in k.dims)
        ]
    return p._memo[key]


def _grid(total: int, threads: int = 256) -> tuple[tuple[int], tuple[int]]:
    """Blocks and threads a launch needs for ``total`` threads, one per word."""
    return ((total + threads - 1) // threads,), (threads,)


def _run(p: Plan, user: Any, packed: Any, count: int, origin: int, pack: bool) -> None:
    user_addr, packed_addr = user.data.ptr, packed.data.ptr
    blocks = p._block_list()
    if blocks is not None:  # irregular: one launch for all its blocks, not one a kernel
        _run_blocks(p, blocks, user, packed, count, origin, pack)
        return
    for k, (counts, ustr, pstr) in _device_dims(p, count):
        w = device_word(k, user_addr + origin, packed_addr)
        nwords = k.size // w
        total = nwords * int(np.prod([c for c, _, _ in k.dims] or [1]))
        _kernel(w)(
            *_grid(total),
            (
                user,
                packed,
                counts,
                ustr,
                pstr,
                np.int32(max(len(k.dims), 1)),
                np.int64(nwords),
                np.int64(total),
                np.int64(origin + k.src),
                np.int64(k.dst),
                np.int32(1 if pack else 0),
            ),
        )


def _run_blocks(
    p: Plan, blocks: Any, user: Any, packed: Any, count: int, origin: int, pack: bool
) -> None:
    """An irregular layout's ``blocks.Blocks`` in one ``block_copy`` launch.

    Every block is cut into pieces of one length (``Blocks.even``); each thread moves one
    word of a piece. The pieces' offsets go to the device once per plan and device.
    """
    import cupy

    at, piece = blocks.even
    key = ("device blocks", cupy.cuda.runtime.getDevice())
    if key not in p._memo:
        p._memo[key] = cupy.asarray(at, cupy.int64)
    step = p.extent if count > 1 else 0
    word = next(
        w
        for w in (8, 4, 2, 1)
        if not (
            piece % w
            or blocks.unit % w
            or step % w
            or (user.data.ptr + origin) % w
            or packed.data.ptr % w
        )
    )
    nwords = piece // word
    total = nwords * at.size * count
    if total == 0:
        return
    _kernel(word, blocks=True)(
        *_grid(total),
        (
            user,
            packed,
            p._memo[key],
            np.int64(at.size),
            np.int64(nwords),
            np.int64(total),
            np.int64(origin),
            np.int64(step),
            np.int32(1 if pack else 0),
        ),
    )


def _device_bytes(obj: Any, name: str) -> Any:
    import cupy

    if not isinstance(obj, cupy.ndarray) or not (obj.flags.c_contiguous or obj.flags.f_contiguous):
        raise DatatypeError(
            f"{name} must be a contiguous cupy array (pass the whole array and an origin)"
        )
    return obj.reshape(-1).view(cupy.uint8)


def pack_device(p: Plan, src: Any, *, count: int = 1, origin: int = 0) -> Any:
    """Pack ``count`` elements of a cupy buffer into a new contiguous cupy uint8 array."""
    import cupy

    area = _device_bytes(src, "src")
    p._bounds(area, origin, count, "src")
    out = cupy.empty(p.size * count, cupy.uint8)
    _run(p, area, out, count, origin, pack=True)
    return out


def unpack_device(p: Plan, buf: Any, dst: Any, *, count: int = 1, origin: int = 0) -> Any:
    """Scatter a packed cupy buffer into ``count`` elements of ``dst`` (a cupy buffer)."""
    area, packed = _device_bytes(dst, "dst"), _device_bytes(buf, "buf")
    if packed.size < p.size * count:
        raise DatatypeError(f"buf has {packed.size} bytes; unpacking needs {p.size * count}")
    p._bounds(area, origin, count, "dst")
    _run(p, area, packed, count, origin, pack=False)
    return dst


def pack_to_host(p: Plan, src: Any, *, origin: int = 0) -> np.ndarray:
    """Pack one element of a cupy buffer straight into pinned host memory.

    One ``cudaMemcpy2DAsync`` when the layout is one block over at most one strided
    dimension with a positive stride of at least the block; otherwise a device pack
    followed by one contiguous copy.
    """
    import cupy

    area = _device_bytes(src, "src")
    p._bounds(area, origin, 1, "src")
    pinned = cupy.cuda.alloc_pinned_memory(max(p.size, 1))
    host = np.frombuffer(pinned, np.uint8, p.size)
    stream = cupy.cuda.get_current_stream()
    if not _copy_2d(p, area, origin, host, stream, to_host=True):
        packed = pack_device(p, src, origin=origin)
        packed.get(out=host, stream=stream)
    stream.synchronize()
    return host


def one_dma(kernels: list[Kernel]) -> tuple[int, int, int, int] | None:
    """``(src, rows, pitch, width)`` when the layout is one ``cudaMemcpy2D``, else None.

    That is one block over at most one dimension whose stride is positive and at least the
    block (the pitch a 2D copy needs); negative or overlapping strides take the kernel.
    """
    if len(kernels) != 1 or len(kernels[0].dims) > 1:
        return None
    k = kernels[0]
    if not k.dims:
        return k.src, 1, max(k.size, 1), k.size
    rows, pitch, packed_pitch = k.dims[0]
    if pitch < k.size or packed_pitch != k.size:
        return None
    return k.src, rows, pitch, k.size


def _copy_2d(p: Plan, area: Any, origin: int, host: np.ndarray, stream: Any, to_host: bool) -> bool:
    """One ``cudaMemcpy2DAsync`` between the layout in ``area`` and packed ``host`` bytes.

    Returns False, copying nothing, when the layout is not one 2D copy.
    """
    import cupy

    dma = one_dma(p._kernels(1))
    if dma is None:
        return False
    start, rows, pitch, width = dma
    if width:
        device, runtime = area.data.ptr + origin + start, cupy.cuda.runtime
        if to_host:
            runtime.memcpy2DAsync(
                host.ctypes.data,
                width,
                device,
                pitch,
                width,
                rows,
                runtime.memcpyDeviceToHost,
                stream.ptr,
            )
        else:
            runtime.memcpy2DAsync(
                device,
                pitch,
                host.ctypes.data,
                width,
                width,
                rows,
                runtime.memcpyHostToDevice,
                stream.ptr,
            )
    return True


def unpack_from_host(p: Plan, host: np.ndarray, dst: Any, *, origin: int = 0) -> Any:
    """Scatter packed host bytes into one element of a cupy buffer (``pack_to_host``'s inverse).

    One ``cudaMemcpy2DAsync`` from host memory when the layout allows it, else one
    contiguous copy to the device and the unpack kernel.
    """
    import cupy

    area = _device_bytes(dst, "dst")
    p._bounds(area, origin, 1, "dst")
    if host.size < p.size:
        raise DatatypeError(f"buf has {host.size} bytes; unpacking needs {p.size}")
    host = np.ascontiguousarray(host[: p.size])
    stream = cupy.cuda.get_current_stream()
    if not _copy_2d(p, area, origin, host, stream, to_host=False):
        unpack_device(p, cupy.asarray(host), area, origin=origin)
    stream.synchronize()
    return dst


def require_cupy(obj: Any) -> Any:
    """The cupy module, or a DatatypeError naming ``obj``'s type when cupy is missing."""
    try:
        import cupy
    except ImportError:
        raise DatatypeError(
            f"{type(obj).__name__} is a GPU array; sending or receiving it needs cupy"
        ) from None
    return cupy


def device_view(obj: Any) -> tuple[Plan, Any, int]:
    """A device view's plan, a cupy uint8 array over the bytes it touches, and its origin there.

    Works for any object with the CUDA array interface (cupy, numba, torch): the bytes
    are addressed from the view's first element, so negative strides work too.
    """
    cupy = require_cupy(obj)
    from .ir import span
    from .plan import plan

    x = cupy.asarray(obj)  # zero copy through __cuda_array_interface__
    p = plan(x)
    lo, hi = span(p.items)
    area = cupy.ndarray((hi - lo,), cupy.uint8, memptr=x.data + lo)
    return p, area, -lo


def device_to_host(obj: Any, method: str) -> np.ndarray:
    """The packed bytes of a device array in host memory, by ``method`` (staged or device)."""
    p, area, origin = device_view(obj)
    if method == "staged":
        return pack_to_host(p, area, origin=origin)
    packed = pack_device(p, area, origin=origin)
    return packed.get()


def host_to_device(host: np.ndarray, obj: Any, method: str) -> Any:
    """Unpack host bytes into a device array, by ``method`` (staged or device); returns ``obj``."""
    import cupy

    p, area, origin = device_view(obj)
    if method == "staged":
        unpack_from_host(p, host, area, origin=origin)
    else:
        unpack_device(p, cupy.asarray(host[: p.size]), area, origin=origin)
        cupy.cuda.get_current_stream().synchronize()
    return obj


def gpu_available() -> bool:
    """Whether cupy imports and sees at least one GPU."""
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # no cupy, no driver or no device
        return False
