"""Turning user arrays into the contiguous 1-D work buffers the algorithms run on.

Inputs may be any numpy array (read-only, non-contiguous, 0-d) or a cupy array, which
is staged through host memory after its stream is synchronised (GPU-aware MPI cannot
be detected reliably, so host staging is the safe default, as in mpi4jax). Results go
to a fresh array, or into ``out=`` (which may be the input itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..runtime.devices import is_device_array
from .errors import CollectiveError

__all__ = ["host_array", "to_device_like", "result_buffer", "check_out", "is_device_array"]


def host_array(x: Any, name: str = "x") -> np.ndarray:
    """A numpy view or copy of ``x`` (a device array is synchronised and copied to host)."""
    if type(x) is np.ndarray:
        if x.dtype.kind == "O":
            raise CollectiveError(f"{name} has dtype object; hpcpar moves numeric arrays only")
        return x
    if is_device_array(x):
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        return cupy.asnumpy(x)
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise CollectiveError(f"{name} must be an array, not {type(x).__name__}") from exc
    if arr.dtype.kind == "O":
        raise CollectiveError(f"{name} has dtype object; hpcpar moves numeric arrays only")
    return arr


def to_device_like(template: Any, host: np.ndarray) -> Any:
    """Return ``host`` as the same kind of array as ``template`` (a device copy for cupy)."""
    if is_device_array(template):
        import cupy

        return cupy.asarray(host)
    return host


def check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype, name: str = "out") -> None:
    """Raise unless ``out`` can hold a result of ``shape`` and ``dtype``."""
    if not isinstance(out, np.ndarray) and not is_device_array(out):
        raise CollectiveError(f"{name} must be an array, not {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or np.dtype(out.dtype) != dtype:
        raise CollectiveError(
            f"{name} has shape {tuple(out.shape)} and dtype {out.dtype}; "
            f"the result needs shape {tuple(shape)} and dtype {dtype}"
        )
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise CollectiveError(f"{name} is read-only")


def result_buffer(
    source: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype, out: Any
) -> tuple[np.ndarray, Callable[[], Any]]:
    """Make the contiguous 1-D work buffer and the function that delivers the result.

    Args:
        source: Data to start from (copied into the work buffer), or None.
        shape: Shape of the result.
        dtype: Its dtype.
        out: The user's output array, or None for a fresh one.

    Returns:
        ``(work, finish)``: the algorithms run on ``work``; ``finish()`` returns the
        result array (``out`` itself when given).
    """
    if out is not None:
        check_out(out, shape, dtype)
    if isinstance(out, np.ndarray) and out.flags.c_contiguous:
        if source is not None and source is not out:
            np.copyto(out, source.reshape(shape))  # numpy copies safely on overlap
        return out.reshape(-1), lambda: out
    work = np.empty(shape, dtype=dtype)
    if source is not None:
        np.copyto(work, source.reshape(shape))

    def finish() -> Any:
        if out is None:
            return work
        if is_device_array(out):
            out[...] = to_device_like(out, work)
        else:
            np.copyto(out, work)
        return out

    return work.reshape(-1), finish
