"""Predicted times: the exact counts of ``counts.py`` priced with a machine profile.

A rank's time is its messages and bytes per level priced at that level's alpha and
beta, plus the bytes it reduces at gamma, plus hpcpar's own software costs (one call,
one Python step per message round). Inter-node bytes are multiplied by how many ranks
of a node drive the network link at once (one for the two-level algorithms, the number
of rails for multi-leader, every rank of the node for flat exchanges). The pipelined
algorithms overlap their stages: the first segment pays every stage, the rest only the
slowest one (every stage again where the profile says ranks outnumber cores). The call's
time is the slowest rank's; for large jobs a few
representative ranks stand in for all (first and last of nodes, fold boundaries).
The MPI library's own call is priced from its measured table in the profile when
there is one, otherwise as the best classic flat algorithm without hpcpar's overheads;
either way plus what running it through hpcpar adds (``library_call_s``).

Predictions within ``TIE`` (0.2%) of each other are ranked by the messages every rank
sends in all (fewest first): the slowest rank's path is the same, and the other ranks'
messages compete with it for the cores and the link, which the path does not see. On 2
virtual nodes x 2 ranks the two-level and multi-leader allreduce tie on small vectors
and multi-leader (every rank crossing the link) measured 1.2-1.4x slower.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..algorithms import ALGORITHMS, ORDER_NONE
from ..pipelined import segment_elements
from ..recursive_doubling import fold, new_rank
from .counts import (
    Counts,
    Layout,
    _binomial_bcast,
    _binomial_reduce,
    _groups,
    _leaders_allreduce,
    counts_for,
)
from .profile import Profile

__all__ = ["Prediction", "predict", "rank_algorithms", "representatives", "CLASSIC", "TIE"]

TIE = 0.002  # predictions this close (relative) count as tied

CLASSIC = {
    "allreduce": ("recursive_doubling", "rabenseifner", "ring"),
    "reduce": ("binomial",),
    "bcast": ("binomial", "scatter_allgather"),
    "allgather": ("ring", "recursive_doubling"),
    "reduce_scatter": ("ring",),
    "alltoall": ("pairwise", "bruck"),
    "alltoallv": ("pairwise",),
    "barrier": ("dissemination",),
}
_HIERARCHICAL_SINGLE_SENDER = {"two_level", "pipelined"}
_FOLDED = {"recursive_doubling", "rabenseifner"}  # flat, fold a count that is not 2^k


@dataclass
class Prediction:
    """One algorithm's predicted time for one call.

    Attributes:
        algorithm: Its name.
        seconds: Predicted time of the call (the slowest rank's).
        parts: Seconds by kind on the slowest rank: intra, inter, reduce, software.
        worst_rank: The rank that sets the time.
        counts: That rank's messages and bytes (None for the library's own call).
        note: How the figure was obtained, when not from the counts.
        messages: Messages the representative ranks send in all (0 for the library's
            call, whose messages hpcpar cannot see).
    """

    algorithm: str
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)
    worst_rank: int = 0
    counts: Counts | None = None
    note: str = ""
    messages: int = 0


def representatives(layout: Layout, limit: int = 64) -> list[int]:
    """Ranks whose times bound the others': every rank of small jobs, a sample of large."""
    p = layout.size
    if p <= limit:
        return list(range(p))
    picks = {0, 1, p - 1, p - 2, p // 2}
    _, rem = fold(p)
    picks |= {max(0, 2 * rem - 2), max(0, 2 * rem - 1), min(p - 1, 2 * rem)}
    for ranks in layout.node_ranks[:2] + layout.node_ranks[-2:]:
        picks |= {ranks[0], ranks[-1]}
    return sorted(picks)


def _sharing(algorithm: str, layout: Layout, rank: int) -> int:
    node = layout.node_ranks[layout.node_of[rank]]
    if algorithm in _HIERARCHICAL_SINGLE_SENDER:
        return 1
    if algorithm == "multi_leader":
        return min(len(r) for r in layout.node_ranks)
    if algorithm == "ring" and list(layout.node_of) == sorted(layout.node_of):
        return 1  # one ring edge leaves each node
    if algorithm in _FOLDED:  # the ranks folded away are idle while the others exchange
        _, rem = fold(layout.size)
        return max(1, sum(1 for r in node if new_rank(r, rem) >= 0))
    return len(node)


def _price(c: Counts, profile: Profile, sharing: int) -> dict[str, float]:
    # Latency per round on the critical path; bandwidth per byte this rank sends or
    # waits for (a fold).
    return {
        "intra": profile.intra.time(c.rounds_intra, c.bytes_intra + c.waited_intra),
        "inter": profile.inter.time(c.rounds_inter, (c.bytes_inter + c.waited_inter) * sharing),
        "reduce": c.reduced_bytes * profile.gamma_s_per_byte,
        "software": profile.call_s + c.rounds * profile.step_s,
    }


def _hidden(parts: dict[str, float]) -> float:
    """What a crowded machine hides of hpcpar's Python (shown as a negative overlap).

    The software costs are calibrated on 8-byte calls, where ranks queue for the cores;
    with longer messages that Python runs while the link carries other ranks' messages,
    so it costs only what exceeds the link's time. Copies and reductions stay on the
    path: the next message needs their result. On the 3 x 2 virtual cluster this took
    the model's time for the measured best from 1.28 to 1.08-1.11 at 128 KiB.
    """
    return min(parts["inter"], parts["software"])


def _pipelined(
    collective: str,
    layout: Layout,
    rank: int,
    count: int,
    itemsize: int,
    profile: Profile,
    root: int,
    commutative: bool = True,
) -> dict[str, float]:
    """Stages overlap across segments: the first segment pays all, the rest the slowest."""
    g = _groups(layout, rank)
    step = segment_elements(itemsize)
    m = min(count, step)
    segments = max(1, -(-count // step))
    stages = [Counts() for _ in range(3)]
    if collective == "allreduce":
        _binomial_reduce(stages[0], g.node, g.local, m * itemsize, 0)
        if g.leaders is not None:
            _leaders_allreduce(stages[1], g.leaders, g.node_index, m, itemsize, commutative)
    elif g.leaders is not None:  # bcast: leaders, then within the node
        _binomial_bcast(stages[1], g.leaders, g.node_index, m * itemsize, layout.node_of[root])
    _binomial_bcast(stages[2], g.node, g.local, m * itemsize, 0)
    priced = [_price(c, profile, 1) for c in stages]
    times = [sum(parts.values()) - profile.call_s for parts in priced]
    parts = {
        kind: sum(p[kind] for p in priced) for kind in ("intra", "inter", "reduce", "software")
    }
    parts["software"] -= 2 * profile.call_s  # one call, not one per stage
    if profile.oversubscribed:
        # The stages of later segments queue for the same cores: what needs a core
        # (copies inside the node, reductions, Python) runs one stage after another,
        # but the link carries one segment while the cores work on another (never less
        # than the slowest stage, what a core per rank would give).
        link = sum(p["inter"] for p in priced)
        parts["overlap"] = (segments - 1) * max(link, sum(times) - link, *times)
    else:  # each rank has a core of its own: a later segment costs its slowest stage
        parts["overlap"] = (segments - 1) * max(times)
    return parts


def predict(
    collective: str,
    algorithm: str,
    layout: Layout,
    count: int,
    itemsize: int,
    profile: Profile,
    *,
    root: int = 0,
    commutative: bool = True,
    counts: list[int] | None = None,
) -> Prediction:
    """Predict one algorithm's time for one call (see the module docstring)."""
    if algorithm == "mpi":
        return _library(collective, layout, count, itemsize, profile, root, counts)
    worst: Prediction | None = None
    messages = 0
    for rank in representatives(layout):
        c = counts_for(
            collective,
            algorithm,
            layout,
            rank,
            count,
            itemsize,
            root=root,
            counts=counts,
            commutative=commutative,
        )
        assert c is not None
        messages += c.messages_intra + c.messages_inter
        if algorithm == "pipelined" and collective in ("allreduce", "bcast"):
            parts = _pipelined(
                collective, layout, rank, count, itemsize, profile, root, commutative
            )
        else:
            parts = _price(c, profile, _sharing(algorithm, layout, rank))
        if profile.oversubscribed:
            parts["overlap"] = parts.get("overlap", 0.0) - _hidden(parts)
        total = sum(parts.values())
        if worst is None or total > worst.seconds:
            worst = Prediction(
                algorithm, total, parts, rank, None if algorithm == "pipelined" else c
            )
    assert worst is not None
    worst.messages = messages
    return worst


def _library(
    collective: str,
    layout: Layout,
    count: int,
    itemsize: int,
    profile: Profile,
    root: int,
    counts: list[int] | None,
) -> Prediction:
    nbytes = (sum(counts) if counts else count) * itemsize
    measured = profile.library_time(collective, nbytes, layout.size)
    if measured is not None:
        parts = {"measured": measured, "software": profile.library_call_s}
        return Prediction(
            "mpi", measured + profile.library_call_s, parts, note="measured in the profile"
        )

    def without_python(pred: Prediction) -> float:  # hpcpar's Python, and what hid it
        hidden = _hidden(pred.parts) if profile.oversubscribed else 0.0
        return pred.seconds - pred.parts.get("software", 0.0) + hidden

    best = min(
        (
            predict(collective, name, layout, count, itemsize, profile, root=root, counts=counts)
            for name in CLASSIC[collective]
        ),
        key=without_python,
    )
    seconds = without_python(best) + profile.library_call_s
    parts = {**best.parts, "software": profile.library_call_s}
    if profile.oversubscribed:
        parts["overlap"] = parts.get("overlap", 0.0) + _hidden(best.parts)
    return Prediction(
        "mpi",
        seconds,
        parts,
        best.worst_rank,
        note=f"modelled as {best.algorithm} (no library timings in the profile)",
        messages=best.messages,
    )


def rank_algorithms(
    collective: str,
    layout: Layout,
    count: int,
    itemsize: int,
    profile: Profile,
    *,
    root: int = 0,
    commutative: bool = True,
    contiguous: bool = True,
    counts: list[int] | None = None,
) -> list[Prediction]:
    """Every algorithm valid for the op and layout, fastest predicted first."""
    out = []
    for name, algorithm in ALGORITHMS[collective].items():
        if not commutative and (
            algorithm.order == ORDER_NONE or (algorithm.order != "any" and not contiguous)
        ):
            continue
        out.append(
            predict(
                collective,
                name,
                layout,
                count,
                itemsize,
                profile,
                root=root,
                commutative=commutative,
                counts=counts,
            )
        )
    # On a tie, prefer a concrete algorithm to the library modelled as that algorithm.
    ranked = sorted(out, key=lambda pred: (pred.seconds, pred.note.startswith("modelled")))
    return _break_ties(ranked)


def _break_ties(ranked: list[Prediction]) -> list[Prediction]:
    """Within each run of predictions ``TIE`` of its fastest, fewest messages first.

    The library's call (no counted messages) keeps its place ahead of hpcpar's schedules
    in a tie, as ``auto`` prefers it within the profile's margin anyway; the library
    modelled as an algorithm stays behind that algorithm.
    """
    out: list[Prediction] = []
    i = 0
    while i < len(ranked):
        j = i + 1
        while j < len(ranked) and ranked[j].seconds <= ranked[i].seconds * (1 + TIE):
            j += 1
        out += sorted(
            ranked[i:j],
            key=lambda pred: (
                pred.algorithm != "mpi" or pred.note.startswith("modelled"),
                pred.messages,
                pred.note.startswith("modelled"),
            ),
        )
        i = j
    return out
