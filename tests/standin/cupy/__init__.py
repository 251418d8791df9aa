"""A host-memory stand-in for cupy, to run the Python of hpcpar's GPU paths where no GPU is.

Used by tests/test_gpu_standin.py in child processes only. "Device" arrays wrap numpy
arrays in host memory and behave as cupy's do where it matters for catching mistakes:
they refuse implicit conversion to numpy (``np.asarray(x)`` raises, as in cupy), and
operations mixing them with numpy arrays raise ``TypeError``; module functions forward
to numpy. ``memcpy2DAsync`` copies row by row and checks its pitches as CUDA does; a
raw kernel runs as a Python loop that follows the CUDA source in
hpcpar/datatypes/gpu.py (and checks each word's alignment). It tests arguments,
offsets, pitches and dispatch, not CUDA: the real GPU tests run where cupy and a GPU are.
"""

import ctypes
import types

import numpy as np

__version__ = "0.0+standin"


def _guard(x):
    """Unwrap device arrays; refuse host arrays as cupy does."""
    if isinstance(x, ndarray):
        return x.a
    if isinstance(x, np.ndarray) and x.ndim > 0:
        raise TypeError("Unsupported type <class 'numpy.ndarray'>")
    if isinstance(x, (list, tuple)):
        return type(x)(_guard(v) for v in x)
    return x


def _wrap(x):
    if isinstance(x, np.ndarray):
        return ndarray(None, _a=x)
    if isinstance(x, np.generic):
        return ndarray(None, _a=np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    if isinstance(x, np.random.Generator):
        return _Forward(x)
    return x


def _forwarded(fn):
    def call(*args, **kwargs):
        return _wrap(fn(*_guard(args), **{k: _guard(v) for k, v in kwargs.items()}))

    return call


class _Forward:
    """An object (numpy's random module, a Generator) whose callables take device arrays."""

    def __init__(self, target):
        self._target = target

    def __getattr__(self, name):
        attr = getattr(self._target, name)
        return _forwarded(attr) if callable(attr) else _wrap(attr)


class MemoryPointer:
    def __init__(self, ptr, owner):
        self.ptr, self.owner = ptr, owner

    def __add__(self, off):
        return MemoryPointer(self.ptr + int(off), self.owner)


def _from_ptr(ptr, shape, dtype, strides=None):
    dtype, shape = np.dtype(dtype), tuple(shape)
    if strides is None:
        strides = tuple(dtype.itemsize * int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    if shape and min(shape) == 0:
        return np.empty(shape, dtype)
    lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True)) + dtype.itemsize
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * (hi - lo)).from_address(ptr + lo))
    return np.ndarray(shape, dtype, buffer=raw, offset=-lo, strides=strides)


class ndarray:
    __array_ufunc__ = None  # numpy's operators defer to ours, which refuse host arrays

    def __init__(self, shape, dtype=np.float64, memptr=None, _a=None):
        if _a is None:
            if memptr is not None:
                _a = _from_ptr(memptr.ptr, shape, dtype)
                self._keep = memptr.owner
            else:
                _a = np.empty(shape, dtype)
        self.a = _a

    def __getattr__(self, name):
        attr = getattr(self.a, name)
        return _forwarded(attr) if callable(attr) else _wrap(attr)

    flags = property(lambda s: s.a.flags)
    shape = property(lambda s: s.a.shape)
    dtype = property(lambda s: s.a.dtype)
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

    def __array__(self, *args, **kwargs):
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly."
        )

    def get(self, stream=None, out=None):
        if out is None:
            return self.a.copy()
        if not isinstance(out, np.ndarray) or out.shape != self.a.shape:
            raise ValueError("out must be a numpy array of the same shape")
        out[...] = self.a
        return out

    def set(self, arr):
        self.a[...] = arr

    def __getitem__(self, key):
        return _wrap(self.a[_guard(key) if isinstance(key, ndarray) else key])

    def __setitem__(self, key, value):
        self.a[_guard(key) if isinstance(key, ndarray) else key] = _guard(value)

    def __len__(self):
        return len(self.a)

    def __iter__(self):
        return (_wrap(v) for v in self.a)

    def __bool__(self):
        return bool(self.a)

    def __float__(self):
        return float(self.a)

    def __int__(self):
        return int(self.a)

    def __index__(self):
        return self.a.__index__()

    def __repr__(self):
        return f"standin.{self.a!r}"


def _operator(name):
    def op(self, *args):
        return _wrap(getattr(self.a, name)(*_guard(args)))

    return op


def _in_place(name):
    def op(self, other):
        getattr(self.a, name)(_guard(other))
        return self

    return op


for _base in (
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "mod",
    "pow",
    "matmul",
    "and",
    "or",
    "xor",
    "lshift",
    "rshift",
):
    setattr(ndarray, f"__{_base}__", _operator(f"__{_base}__"))
    setattr(ndarray, f"__r{_base}__", _operator(f"__r{_base}__"))
    setattr(ndarray, f"__i{_base}__", _in_place(f"__i{_base}__"))
for _name in ("lt", "le", "gt", "ge", "eq", "ne", "neg", "pos", "abs", "invert"):
    setattr(ndarray, f"__{_name}__", _operator(f"__{_name}__"))
ndarray.__hash__ = None


def __getattr__(name):  # every other cupy function: numpy's, on device arrays
    attr = getattr(np, name)
    if isinstance(attr, type) or not callable(attr):
        return attr
    return _forwarded(attr)


def asarray(x, dtype=None):
    if isinstance(x, ndarray):
        return x if dtype is None else ndarray(None, _a=x.a.astype(dtype, copy=False))
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        i = x.__cuda_array_interface__
        x = ndarray(None, _a=_from_ptr(i["data"][0], i["shape"], i["typestr"], i.get("strides")))
        return asarray(x, dtype)
    return ndarray(None, _a=np.array(x, dtype=dtype))


array = asarray


def asnumpy(x, stream=None):
    return x.a.copy() if isinstance(x, ndarray) else np.asarray(x)


random = _Forward(np.random)


class _Event:
    pass


class _Stream:
    ptr = 0

    def __init__(self, non_blocking=False):
        self.non_blocking = non_blocking

    def synchronize(self):
        pass

    def record(self, event=None):
        return _Event()

    def wait_event(self, event):
        assert isinstance(event, _Event)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_CURRENT = _Stream()


def _memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream):
    if not (dpitch >= width and spitch >= width and width > 0 and height > 0):
        raise ValueError(
            f"cudaErrorInvalidPitchValue/InvalidValue: {dpitch, spitch, width, height}"
        )
    for r in range(height):
        ctypes.memmove(dst + r * dpitch, src + r * spitch, width)


class _Kernel:
    """hpcpar/datatypes/gpu.py's strided_copy<T>, one thread after the other."""

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


class _BlockKernel:
    """hpcpar/datatypes/gpu.py's block_copy<T>, one thread after the other."""

    def __init__(self, width):
        self.w = width

    def __call__(self, grid, block, args):
        user, packed, at, nblocks, nwords, total, user0, step, pack = args
        at = at.a
        assert grid[0] * block[0] >= int(total)
        U, P, W = user.a.view(np.uint8), packed.a.view(np.uint8), self.w
        for i in range(int(total)):
            word, b = i % int(nwords), i // int(nwords)
            u = int(user0) + (b // int(nblocks)) * int(step) + int(at[b % int(nblocks)]) + word * W
            p = i * W
            assert u >= 0 and u + W <= U.size and p + W <= P.size
            assert (user.data.ptr + u) % W == 0 and (packed.data.ptr + p) % W == 0
            if int(pack):
                P[p : p + W] = U[u : u + W]
            else:
                U[u : u + W] = P[p : p + W]


class RawModule:
    def __init__(self, code, options=(), name_expressions=()):
        self.names = list(name_expressions)
        assert all(name.split("<")[0] in code for name in self.names)

    def get_function(self, name):
        assert name in self.names, name
        widths = {
            "unsigned long long": 8,
            "unsigned int": 4,
            "unsigned short": 2,
            "unsigned char": 1,
        }
        width = widths[name[name.index("<") + 1 : -1]]
        return _BlockKernel(width) if name.startswith("block_copy") else _Kernel(width)


cuda = types.SimpleNamespace(
    get_current_stream=lambda: _CURRENT,
    Stream=_Stream,
    alloc_pinned_memory=bytearray,
    runtime=types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDevice=lambda: 0,
        getDeviceProperties=lambda i: {"name": b"host-memory stand-in", "totalGlobalMem": 0},
        memcpy2DAsync=_memcpy2d,
        memcpyDeviceToHost=2,
        memcpyHostToDevice=1,
    ),
)
