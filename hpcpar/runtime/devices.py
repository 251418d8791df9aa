"""Where an array lives: the one test every layer that moves GPU buffers uses."""

from __future__ import annotations

from typing import Any

__all__ = ["is_device_array"]


def is_device_array(x: Any) -> bool:
    """Whether ``x`` lives on a GPU (cupy or anything with the CUDA array interface)."""
    return hasattr(x, "__cuda_array_interface__")
