"""A host-memory stand-in for cupy: just enough of it to run the Python of hpcpar's GPU
datatype and point-to-point paths where no GPU is (tests/hpcpar/test_gpu_standin.py).

"Device" memory is host memory; ``memcpy2DAsync`` copies row by row with the pitches
checked as CUDA checks them; the raw kernel runs as a Python loop that follows the CUDA
source in hpcpar/datatypes/gpu.py line by line (and checks each word's alignment). It
tests the launch arguments, offsets, pitches and dispatch, not CUDA: the real tests
run where cupy and a GPU are.
"""

import ctypes
from types import SimpleNamespace

import numpy as np

uint8, int64, float64 = np.uint8, np.int64, np.float64


class MemoryPointer:
    def __init__(self, ptr, owner):
        self.ptr, self.owner = ptr, owner

    def __add__(self, off):
        return MemoryPointer(self.ptr + int(off), self.owner)


def _from_ptr(ptr, shape, dtype, strides=None, owner=None):
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if strides is None:
        strides = tuple(dtype.itemsize * int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    if not shape or min(shape) == 0:
        return np.empty(shape, dtype)
    lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides, strict=False))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides, strict=False)) + dtype.itemsize
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * (hi - lo)).from_address(ptr + lo))
    return np.ndarray(shape, dtype, buffer=raw, offset=-lo, strides=strides)


class ndarray:
    def __init__(self, shape, dtype=float64, memptr=None, _a=None):
        if _a is None:
            _a = (
                _from_ptr(memptr.ptr, shape, dtype)
                if memptr is not None
                else np.empty(shape, dtype)
            )
            self._keep = memptr.owner if memptr is not None else None
        self.a = _a

    flags = property(lambda s: s.a.flags)
    size = property(lambda s: s.a.size)
    shape = property(lambda s: s.a.shape)
    dtype = property(lambda s: s.a.dtype)
    nbytes = property(lambda s: s.a.nbytes)
    data = property(lambda s: MemoryPointer(s.a.__array_interface__["data"][0], s))

    @property
    def __cuda_array_interface__(self):
        i = self.a.__array_interface__
        return {
            "shape": i["shape"],
            "strides": i["strides"],
            "typestr": i["typestr"],
            "data": i["data"],
            "version": 3,
        }

    def reshape(self, *s):
        return ndarray(None, _a=self.a.reshape(*s))

    def view(self, dt):
        return ndarray(None, _a=self.a.view(dt))

    def __getitem__(self, k):
        return ndarray(None, _a=self.a[k])

    def get(self, stream=None, out=None):
        if out is None:
            return self.a.copy()
        out[...] = self.a
        return out

    def set(self, arr):
        self.a[...] = arr


def asarray(x, dtype=None):
    if dtype is not None:
        return ndarray(None, _a=np.asarray(x, dtype=dtype))
    if isinstance(x, ndarray):
        return x
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        i = x.__cuda_array_interface__
        return ndarray(None, _a=_from_ptr(i["data"][0], i["shape"], i["typestr"], i.get("strides")))
    return ndarray(None, _a=np.array(x))


def asnumpy(x):
    return x.a.copy()


def zeros(shape, dtype=float64):
    return ndarray(None, _a=np.zeros(shape, dtype))


def empty(shape, dtype=float64):
    return ndarray(None, _a=np.empty(shape, dtype))


def zeros_like(x):
    return ndarray(None, _a=np.zeros_like(x.a))


def asfortranarray(x):
    return ndarray(None, _a=np.asfortranarray(x.a))


class _Stream:
    ptr = 0

    def synchronize(self):
        pass


def _memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream):
    assert dpitch >= width and spitch >= width and width > 0 and height > 0, (
        dpitch,
        spitch,
        width,
        height,
    )
    for r in range(height):
        ctypes.memmove(dst + r * dpitch, src + r * spitch, width)


class _Kernel:
    def __init__(self, width):
        self.w = width

    def __call__(self, grid, block, args):
        user, packed, counts, ustr, pstr, ndims, nwords, total, user0, packed0, pack = args
        counts, ustr, pstr = counts.a, ustr.a, pstr.a
        assert grid[0] * block[0] >= int(total)
        U, P, W = user.a.view(np.uint8), packed.a.view(np.uint8), self.w
        for i in range(int(total)):
            word, rest = i % int(nwords), i // int(nwords)
            u, p = int(user0) + word * W, int(packed0) + word * W
            for d in range(int(ndims) - 1, -1, -1):
                k = rest % int(counts[d])
                rest //= int(counts[d])
                u += k * int(ustr[d])
                p += k * int(pstr[d])
            assert (user.data.ptr + u) % W == 0 and (packed.data.ptr + p) % W == 0
            if int(pack):
                P[p : p + W] = U[u : u + W]
            else:
                U[u : u + W] = P[p : p + W]


class RawModule:
    def __init__(self, code, options, name_expressions):
        self.names = name_expressions

    def get_function(self, name):
        w = {"unsigned long long": 8, "unsigned int": 4, "unsigned short": 2, "unsigned char": 1}
        return _Kernel(w[name[name.index("<") + 1 : -1]])


cuda = SimpleNamespace(
    get_current_stream=_Stream,
    alloc_pinned_memory=bytearray,
    runtime=SimpleNamespace(
        getDeviceCount=lambda: 1,
        memcpy2DAsync=_memcpy2d,
        memcpyDeviceToHost=2,
        memcpyHostToDevice=1,
    ),
    RawModule=RawModule,
)
