"""The compressed allreduce in the cost model: predicted times, and ``compression="auto"``.

A scheme's time is the compressed allreduce's exact counts (``allreduce.count_allreduce``:
the rail's messages carry the coded bytes) priced like any algorithm's, plus the bytes
its rank codes and decodes at the profile's measured codec rate (``Profile.codecs``,
from ``hpcpar calibrate``). ``auto`` takes the fastest of the exact allreduce and the
schemes whose error bound on this many nodes is within the caller's tolerance; on one
node it never codes (there is no slow level to save).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...runtime.profile import Profile
from ..compression.allreduce import coded_bytes, count_allreduce
from ..compression.schemes import SCHEMES, Codec, codec_for
from ..errors import CollectiveError
from ..registry import Shape
from ..tally import Counts, Layout, groups_of
from .model import Prediction, hidden, price, representatives

if TYPE_CHECKING:
    from ..compression import Compression

__all__ = [
    "SchemePrediction",
    "predict_scheme",
    "rank_schemes",
    "choose_scheme",
    "scheme_plan",
    "ONE_NODE",
]

ONE_NODE = "one node: nothing crosses a slow level, so nothing is coded"


@dataclass
class SchemePrediction:
    """One scheme's predicted time and error bound for one call.

    Attributes:
        scheme: Its name (``"exact"`` for the uncompressed allreduce).
        prediction: The model's time and its parts (``codec``: coding and decoding).
        bound: The result's error bound (relative to the nodes' block maxima summed).
        wire_bytes: Bytes the slowest rank sends across nodes (None: not counted, as
            for the library's call or a pipelined schedule).
    """

    scheme: str
    prediction: Prediction
    bound: float
    wire_bytes: int | None


def predict_scheme(
    codec: Codec, layout: Layout, count: int, itemsize: int, profile: Profile
) -> SchemePrediction:
    """Predict the compressed allreduce of ``count`` elements with ``codec`` on ``layout``."""
    shape = Shape(count, itemsize)
    senders = min(len(r) for r in layout.node_ranks)
    worst: Prediction | None = None
    wire = 0
    for rank in representatives(layout):
        c = Counts()
        count_allreduce(c, groups_of(layout, rank), rank, shape, codec)
        parts = price(c, profile, senders)
        parts["codec"] = coded_bytes(layout, rank, count, codec) * profile.codec_s_per_byte(
            codec.name
        )
        if profile.oversubscribed:
            parts["overlap"] = -hidden(parts)
        total = sum(parts.values())
        if worst is None or total > worst.seconds:
            worst = Prediction(f"compressed_{codec.name}", total, parts, rank, c)
            wire = c.bytes_inter
    assert worst is not None
    accumulator = "float64" if itemsize == 8 else "float32"
    return SchemePrediction(
        codec.name, worst, codec.bound(len(layout.node_ranks), accumulator), wire
    )


def rank_schemes(
    layout: Layout,
    count: int,
    itemsize: int,
    profile: Profile,
    exact: Prediction,
    *,
    block: int,
    rounding: str = "nearest",
) -> list[SchemePrediction]:
    """The exact allreduce (``exact``, the model's best) and every scheme, fastest first."""
    out = [
        SchemePrediction("exact", exact, 0.0, exact.counts.bytes_inter if exact.counts else None)
    ]
    for name in SCHEMES:
        if name == "1bit" and block % 8:
            continue
        codec = codec_for(name, block, rounding if name == "int8" else "nearest")
        out.append(predict_scheme(codec, layout, count, itemsize, profile))
    return sorted(out, key=lambda s: s.prediction.seconds)


def choose_scheme(ranking: list[SchemePrediction], tolerance: float, nodes: int) -> tuple[str, str]:
    """The fastest entry of ``ranking`` within ``tolerance``, and why."""
    if nodes <= 1:
        return "exact", ONE_NODE
    fits = [s for s in ranking if s.bound <= tolerance]
    best = fits[0]  # exact always fits
    over = [s.scheme for s in ranking if s.bound > tolerance]
    reason = (
        f"fastest predicted within tolerance {tolerance:g} "
        f"({best.prediction.seconds * 1e6:.1f} us, bound {best.bound:.3g})"
    )
    if over:
        reason += f"; over the tolerance: {', '.join(over)}"
    return best.scheme, reason


def scheme_plan(
    spec: Compression,
    layout: Layout,
    count: int,
    itemsize: int,
    profile: Profile,
    exact: Prediction,
) -> tuple[str, str, list[SchemePrediction]]:
    """The scheme a call with ``spec`` runs on ``layout`` ("exact": none), why, and the ranking.

    ``exact``: the model's prediction for what the exact ``auto`` runs.

    Raises:
        CollectiveError: a named scheme whose bound on this many nodes exceeds the
            spec's tolerance.
    """
    nodes = len(layout.node_ranks)
    ranking = rank_schemes(
        layout, count, itemsize, profile, exact, block=spec.block, rounding=spec.rounding
    )
    if nodes <= 1:
        return "exact", ONE_NODE, ranking
    if spec.scheme != "auto":
        bound = next(s.bound for s in ranking if s.scheme == spec.scheme)
        if spec.tolerance is not None and bound > spec.tolerance:
            raise CollectiveError(
                f"allreduce: {spec.scheme}'s error bound on {nodes} nodes is {bound:.3g}, "
                f"over tolerance {spec.tolerance:g}"
            )
        return spec.scheme, f"compression={spec.scheme!r} was requested", ranking
    name, reason = choose_scheme(ranking, float(spec.tolerance or 0.0), nodes)
    return name, f"auto: {reason}", ranking
