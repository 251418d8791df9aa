"""Checkpoint state: a pytree (dicts, lists, tuples) of arrays and plain values, as named leaves.

Arrays (numpy, or cupy: restored as numpy) become raw bytes in a shard with their dtype
and shape in its JSON manifest, as do numbers, strings, booleans and None. Nothing else
is accepted, so loading a checkpoint never executes code.

A leaf is named by its path (``"opt/m/0"``: key ``opt``, key ``m``, item 0). The tree's
shape (which node is a dict, a list or a tuple, and the keys' order) is kept as JSON in
the reserved entry ``.tree``, so a restore returns the same structure and types. An
array may be declared ``Sharded`` (one rank's block of a global array) or ``Replicated``
(the same on every rank); the declaration is kept in ``.layout/<leaf name>``, and lets a
job with another number of ranks restore it (``checkpoint.reshard``).
"""

from __future__ import annotations

import json
import operator
from typing import Any

import numpy as np

from hpcpar.errors import HpcparError

__all__ = [
    "CheckpointError",
    "Sharded",
    "Replicated",
    "flatten_state",
    "unflatten_state",
    "layouts_of",
    "user_entries",
    "SEPARATOR",
    "TREE",
    "LAYOUT",
]

SEPARATOR = "/"
TREE = ".tree"  # reserved entry names start with '.', which user keys may not
LAYOUT = ".layout/"


class CheckpointError(HpcparError):
    """A checkpoint that cannot be written, found, verified or restored."""


def _shape(value: Any, what: str) -> tuple[int, ...]:
    items = (value,) if isinstance(value, (int, np.integer)) else value
    try:
        out = tuple(operator.index(n) for n in items)
    except TypeError:
        raise CheckpointError(f"{what} must be a sequence of integers, not {value!r}") from None
    if any(isinstance(n, bool) or n < 0 for n in items):
        raise CheckpointError(f"{what} must hold non-negative integers, not {value!r}")
    return out


class Sharded:
    """One rank's block of a global array, for a checkpoint that can change rank count.

    Args:
        block: This rank's part (numpy or cupy), any number of dimensions.
        global_shape: The whole array's shape (as many dimensions as ``block``).
        offset: Where ``block`` starts in the global array (an int for one dimension).

    The ranks' blocks must tile the global array exactly (no overlap, no gap; blocks may
    be uneven and cut along any axes); ``Checkpointer.save`` checks it on every rank.
    A restore returns ``Sharded`` leaves holding each rank's (new) block.

    Raises:
        CheckpointError: dimensions that disagree, or a block outside the global shape.
    """

    def __init__(self, block: Any, global_shape: Any, offset: Any) -> None:
        self.block = block
        self.global_shape = _shape(global_shape, "Sharded global_shape")
        self.offset = _shape(offset, "Sharded offset")
        shape = tuple(block.shape)
        if not len(shape) == len(self.global_shape) == len(self.offset):
            raise CheckpointError(
                f"Sharded: a block of shape {shape}, global_shape {self.global_shape} and "
                f"offset {self.offset} need the same number of dimensions"
            )
        if any(o + n > g for o, n, g in zip(self.offset, shape, self.global_shape, strict=True)):
            raise CheckpointError(
                f"Sharded: a block of shape {shape} at offset {self.offset} does not fit in "
                f"global_shape {self.global_shape}"
            )

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.block, dtype=dtype)

    def __repr__(self) -> str:
        return (
            f"Sharded(block of shape {tuple(self.block.shape)}, global_shape="
            f"{self.global_shape}, offset={self.offset})"
        )


class Replicated:
    """An array that is the same on every rank: stored once (rank 0's copy).

    With ``HPCPAR_CHECK=1`` a save verifies that every rank's copy is equal. A restore
    (on any number of ranks) returns ``Replicated`` leaves holding the array.
    """

    def __init__(self, array: Any) -> None:
        self.array = array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.array, dtype=dtype)

    def __repr__(self) -> str:
        return f"Replicated(array of shape {tuple(self.array.shape)})"


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__")


def _array(name: str, value: Any) -> Any:
    if not _is_array(value):
        raise CheckpointError(
            f"state key {name!r}: {type(value).__name__} is not an array (Sharded and "
            "Replicated hold numpy or cupy arrays)"
        )
    if np.dtype(value.dtype).hasobject:
        raise CheckpointError(f"state key {name!r}: arrays of Python objects are not checkpointed")
    return value  # device arrays are copied to pinned host memory later


def flatten_state(state: Any) -> dict[str, Any]:
    """A pytree -> ``{leaf name: array or plain value}``, plus ``.tree`` and ``.layout/*``.

    Raises:
        CheckpointError: a dict key that is not a non-empty string without '/' (or starts
            with '.'), or a value of an unsupported type (the message names the key).
    """
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint state must be a dict, not {type(state).__name__}")
    out: dict[str, Any] = {}
    out[TREE] = json.dumps(_flatten(state, "", out), separators=(",", ":"))
    return out


def _flatten(value: Any, name: str, out: dict[str, Any]) -> Any:
    """Add ``value``'s leaves under ``name`` to ``out``; return its tree spec."""
    prefix = name + SEPARATOR if name else ""
    if isinstance(value, dict):
        spec = []
        for key in value:
            if not isinstance(key, str) or not key or SEPARATOR in key or key.startswith("."):
                raise CheckpointError(
                    f"state key {prefix + str(key)!r}: dict keys must be non-empty strings "
                    "without '/' that do not start with '.'"
                )
            spec.append([key, _flatten(value[key], prefix + key, out)])
        return {"d": spec}
    if isinstance(value, (list, tuple)):
        items = [_flatten(v, f"{prefix}{i}", out) for i, v in enumerate(value)]
        return {"t" if isinstance(value, tuple) else "l": items}
    if isinstance(value, Sharded):
        out[name] = _array(name, value.block)
        out[LAYOUT + name] = json.dumps(
            {"kind": "sharded", "global": list(value.global_shape), "offset": list(value.offset)}
        )
    elif isinstance(value, Replicated):
        out[name] = _array(name, value.array)
        out[LAYOUT + name] = json.dumps({"kind": "replicated"})
    elif _is_array(value):
        out[name] = _array(name, value)
    elif isinstance(value, (bool, int, float, str)) or value is None:
        out[name] = value
    elif isinstance(value, np.generic) and not np.dtype(value.dtype).hasobject:
        out[name] = value.item()
    else:
        raise CheckpointError(
            f"state key {name!r}: unsupported type {type(value).__name__} (use dicts, lists "
            "and tuples of arrays, numbers, strings, booleans or None)"
        )
    return 0


def layouts_of(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The declared layouts of a flat state: leaf name -> ``{"kind": ...}``."""
    out = {}
    for key, value in flat.items():
        if key.startswith(LAYOUT):
            try:
                doc = json.loads(value)
            except (TypeError, ValueError, RecursionError):
                raise CheckpointError(f"layout of {key[len(LAYOUT) :]!r} is unreadable") from None
            out[key[len(LAYOUT) :]] = doc
    return out


def user_entries(flat: dict[str, Any]) -> dict[str, Any]:
    """The leaves of a flat state, without the reserved entries."""
    return {k: v for k, v in flat.items() if not k.startswith(".")}


def unflatten_state(flat: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``flatten_state`` (declared layouts come back as their markers).

    A flat state without ``.tree`` (written before trees were kept) is nested dicts.

    Raises:
        CheckpointError: a tree description that does not match the leaves.
    """
    layouts = layouts_of(flat)
    leaves = {k: _marked(v, layouts.get(k)) for k, v in user_entries(flat).items()}
    if TREE not in flat:
        out: dict[str, Any] = {}
        for name, value in leaves.items():
            node = out
            *parents, leaf = name.split(SEPARATOR)
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out
    try:
        spec = json.loads(flat[TREE])
        tree = _build(spec, "", leaves)
    except (TypeError, ValueError, KeyError, IndexError, RecursionError):
        raise CheckpointError(
            "the checkpoint's tree description does not match its leaves"
        ) from None
    if not isinstance(tree, dict):
        raise CheckpointError("the checkpoint's tree description does not match its leaves")
    return tree


def _marked(value: Any, layout: dict[str, Any] | None) -> Any:
    if layout is None or not isinstance(value, np.ndarray):
        return value
    if layout.get("kind") == "replicated":
        return Replicated(value)
    if layout.get("kind") == "sharded":
        return Sharded(value, layout["global"], layout["offset"])
    return value


def _build(spec: Any, name: str, leaves: dict[str, Any]) -> Any:
    prefix = name + SEPARATOR if name else ""
    if spec == 0:
        return leaves[name]
    ((kind, items),) = spec.items()
    if kind == "d":
        return {key: _build(sub, prefix + key, leaves) for key, sub in items}
    built = [_build(sub, f"{prefix}{i}", leaves) for i, sub in enumerate(items)]
    if kind == "t":
        return tuple(built)
    if kind == "l":
        return built
    raise KeyError(kind)
