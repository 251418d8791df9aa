"""Device arrays (cupy) in the memory snapshot: pinned host buffers, a copy stream.

The snapshot of a device array is a device-to-host copy into page-locked host memory
on a stream of its own, ordered after the work already queued on the caller's current
stream (an event), so the copy runs at full PCIe/NVLink speed and, with
``save(..., lazy=True)``, overlaps with the caller's next kernels.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["is_device_array", "pinned_empty", "device_to_host"]

_local = threading.local()


def is_device_array(value: Any) -> bool:
    """Whether ``value`` is a CUDA array (cupy, or anything with the CUDA interface)."""
    return hasattr(value, "__cuda_array_interface__") and not isinstance(value, np.ndarray)


def pinned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A numpy array in page-locked host memory."""
    import cupyx

    return cupyx.empty_pinned(shape, dtype=dtype)


def device_to_host(value: Any, out: np.ndarray) -> None:
    """Copy a device array into ``out`` (pinned) on a separate stream, and wait for it."""
    import cupy

    stream = getattr(_local, "stream", None)
    if stream is None:
        stream = _local.stream = cupy.cuda.Stream(non_blocking=True)
    src = cupy.ascontiguousarray(cupy.asarray(value))  # queued on the caller's stream
    stream.wait_event(cupy.cuda.get_current_stream().record())
    src.get(stream=stream, out=out)
    stream.synchronize()
