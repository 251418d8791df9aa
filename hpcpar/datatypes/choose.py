"""How to send a non-contiguous layout: pack it, or hand MPI the derived datatype.

A small table measured by ``hpcpar calibrate`` (block size x message size x stride ->
seconds for each method, between two ranks) decides; the nearest measured class in log
scale is used. Without a table: messages up to ``SMALL_MESSAGE_BYTES`` go as the datatype,
since packing in Python costs more than such a message. Larger irregular layouts (many
small blocks, ``Plan._block_list``) are packed, with a table too (it is measured on
regular vectors): MPI walking many scattered blocks takes many times as long as
packing them. Larger regular ones go as the datatype, unless the node runs more ranks
than it has cores: then MPI's pipelined datatype sends wait for the other rank's turn
and packing is faster. ``hpcpar bench datatypes`` (its send and halo cases) measures
both methods against each other.

GPU arrays travel through host memory, by one of two methods (``device_send_method``):
``staged``, one ``cudaMemcpy2D`` between the view and host memory where the layout is
one strided run, or ``device``, the pack kernel into a device buffer and one contiguous
copy. ``calibrate`` times both where a GPU is present (a table like the one above);
without one, a layout one 2D copy can move is staged and any other takes the kernel.
``explain_send`` shows the choice and the figures behind it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from ..runtime.profile import active_profile
from .ir import Strided
from .plan import Plan
from .threads import local_ranks

__all__ = ["send_method", "device_send_method", "explain_send", "typical_block"]

SMALL_MESSAGE_BYTES = 4096  # without a measured table, messages this small go as datatypes


def _weighted(p: Plan, value: Callable[[Strided], float]) -> float | None:
    """``value`` of the plan's strided blocks, weighted by the bytes each carries."""
    total, weighted = 0, 0.0
    stack = list(p.items)
    while stack:
        item = stack.pop()
        if isinstance(item, Strided):
            total += item.nbytes
            weighted += item.nbytes * value(item)
        else:
            stack.extend(item.body)
    return weighted / total if total else None


def typical_block(p: Plan) -> int:
    """The plan's block size, weighted by the bytes each block carries."""
    return int(_weighted(p, lambda item: item.size) or 0)


def typical_spread(p: Plan) -> float:
    """How far apart the plan's blocks lie, in block sizes (1: dense; weighted by bytes).

    The innermost stride of each strided block over its size; a single block counts 1.
    """

    def spread(item: Strided) -> float:
        if not (item.counts and item.size):
            return 1.0
        return max(abs(item.strides[-1]) / item.size, 1.0)

    return _weighted(p, spread) or 1.0


def _table(profile: Any, key: str = "send_methods") -> list[list[float]]:
    if profile is None:
        return []
    entry = getattr(profile, "mpi_library", {}).get(key)
    return entry.get("table", []) if isinstance(entry, dict) else []


def _nearest(
    table: list[list[float]], block: int, nbytes: int, spread: float | None = None
) -> list[float] | None:
    """The measured class nearest in log scale to this block size and message size.

    Where the table has a fifth column (the stride) and ``spread`` is given, how far
    apart the blocks lie counts too (rows without it were measured twice their size
    apart).
    """
    if not table:
        return None

    def distance(row: list[float]) -> float:
        far = abs(math.log2(max(row[0], 1) / max(block, 1))) + abs(
            math.log2(max(row[1], 1) / max(nbytes, 1))
        )
        if spread is not None:
            measured = row[4] / max(row[0], 1) if len(row) > 4 else 2.0
            far += abs(math.log2(max(measured, 1.0) / max(spread, 1.0)))
        return far

    return min(table, key=distance)


def oversubscribed() -> bool:
    """Whether this node runs more ranks (as the launcher says) than it has cores."""
    return local_ranks() > (os.cpu_count() or 1)


def send_method(p: Plan, count: int = 1, profile: Any = None) -> tuple[str, str]:
    """``("pack" | "datatype", reason)`` for sending ``count`` elements of ``p``.

    Worked out once per layout, count and profile (kept with the plan's layout).
    """
    active = _active(profile)
    known = p._memo.get(("send method", count))
    if known is not None and known[0] is active:
        return known[1]
    nbytes = p.size * count
    row = _nearest(_table(active), typical_block(p), nbytes, typical_spread(p))
    if (
        count == 1
        and len(p.items) == 1
        and isinstance(p.items[0], Strided)
        and not p.items[0].counts
    ):
        chosen = "datatype", "one contiguous block: MPI sends it in place, nothing to pack"
    elif row is None and nbytes <= SMALL_MESSAGE_BYTES:
        chosen = (
            "datatype",
            (
                f"no measured send table (hpcpar calibrate records one); {nbytes} B is at most "
                f"{SMALL_MESSAGE_BYTES} B: MPI walks the datatype, cheaper than packing in Python"
            ),
        )
    elif nbytes > SMALL_MESSAGE_BYTES and p._block_list() is not None:
        # before the table, which is measured on regular vectors
        chosen = (
            "pack",
            (
                "an irregular layout (many small blocks): packing is far faster than MPI "
                "walking them (131,072 blocks: 30x)"
            ),
        )
    elif row is None and oversubscribed():
        chosen = (
            "pack",
            (
                "no measured send table (hpcpar calibrate records one); more ranks than cores "
                "on this node: MPI's pipelined datatype sends wait for the other rank's turn"
            ),
        )
    elif row is None:
        chosen = (
            "datatype",
            (
                "no measured send table (hpcpar calibrate records one); a regular layout: MPI "
                "walks hpcpar's datatype of it, no copy in Python"
            ),
        )
    else:
        chosen = _choice(row, ("pack", "datatype"), (row[2], row[3]), nbytes)
    p._memo[("send method", count)] = (active, chosen)
    return chosen


def _choice(
    row: list[float], names: tuple[str, str], times: tuple[float, float], nbytes: int
) -> tuple[str, str]:
    """The faster of two methods in the nearest measured class, with the figures.

    The prediction for this message scales the class's times by its size (both methods
    alike, so the choice is the class's).
    """
    scale = nbytes / max(row[1], 1)
    first, second = times
    return (names[0] if first <= second else names[1]), (
        f"predicted for {nbytes} B: {names[0]} {first * scale * 1e6:.1f} us, {names[1]} "
        f"{second * scale * 1e6:.1f} us (measured at {int(row[0])} B blocks / {int(row[1])} B: "
        f"{first * 1e6:.1f} and {second * 1e6:.1f} us)"
    )


def _active(profile: Any) -> Any:
    return active_profile() if profile is None else profile


def device_send_method(p: Plan, profile: Any = None) -> tuple[str, str]:
    """``("staged" | "device", reason)`` for moving a GPU view's packed bytes to or from host."""
    from .gpu import one_dma

    row = _nearest(_table(_active(profile), "device_send_methods"), typical_block(p), p.size)
    if row is not None:  # [block, bytes, device s, staged s]
        return _choice(row, ("staged", "device"), (row[3], row[2]), p.size)
    if one_dma(p._kernels(1)) is not None:
        return "staged", "no measured table: one strided run is one cudaMemcpy2D to the host"
    return "device", "no measured table: the layout needs the pack kernel, then one copy"


def explain_send(obj: Any, count: int = 1, profile: Any = None) -> str:
    """One paragraph: the layout, its typical block, the chosen method and why."""
    from ..runtime.devices import is_device_array
    from .plan import plan

    p = obj if isinstance(obj, Plan) else plan(obj)
    if is_device_array(obj):
        method, reason = device_send_method(p, profile)
    else:
        method, reason = send_method(p, count, profile)
    sizes = (
        f"typical block {typical_block(p)} B, blocks {typical_spread(p):.3g} block sizes "
        f"apart, {p.size * count} B packed"
    )
    return f"{p.describe()}\n{sizes}\nsend by: {method} ({reason})"
