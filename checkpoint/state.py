"""Checkpoint state: nested dicts of arrays, numbers and strings, flattened to named leaves.

Arrays (numpy, or cupy: restored as numpy) become raw bytes in a shard with their dtype
and shape in its JSON manifest, as do numbers, strings, booleans and None. Nothing else
is accepted, so loading a checkpoint never executes code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcpar.errors import HpcparError

__all__ = ["CheckpointError", "flatten_state", "unflatten_state", "SEPARATOR"]

SEPARATOR = "/"


class CheckpointError(HpcparError):
    """A checkpoint that cannot be written, found, verified or restored."""


def flatten_state(state: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": x}}`` -> ``{"a/b": x}``; arrays are kept, scalars made plain.

    Raises:
        CheckpointError: a key that is not a non-empty string without '/', or a value of
            an unsupported type (the message names the key).
    """
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint state must be a dict, not {type(state).__name__}")
    out: dict[str, Any] = {}
    for key, value in state.items():
        if not isinstance(key, str) or not key or SEPARATOR in key or key.startswith("."):
            raise CheckpointError(
                f"state key {prefix + str(key)!r}: keys must be non-empty strings without '/'"
            )
        name = prefix + key
        if isinstance(value, dict):
            out.update(flatten_state(value, name + SEPARATOR))
        elif isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__"):
            if np.dtype(value.dtype).hasobject:
                raise CheckpointError(
                    f"state key {name!r}: arrays of Python objects are not checkpointed"
                )
            out[name] = value  # device arrays are copied to pinned host memory later
        elif isinstance(value, (bool, int, float, str)) or value is None:
            out[name] = value
        elif isinstance(value, np.generic):
            out[name] = value.item()
        else:
            raise CheckpointError(
                f"state key {name!r}: unsupported type {type(value).__name__} "
                "(use dicts of arrays, numbers, strings, booleans or None)"
            )
    return out


def unflatten_state(flat: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``flatten_state``."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        node = out
        *parents, leaf = name.split(SEPARATOR)
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out
