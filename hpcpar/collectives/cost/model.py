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
messages compete with it for the cores and the link, which the path does not see (on
2 virtual nodes x 2 ranks the two-level and multi-leader allreduce tie on small vectors,
and multi-leader, every rank crossing the link, measures slower).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...runtime.profile import Profile
from ..algorithms import ALGORITHMS
from ..registry import LIBRARY, ORDER_ANY, ORDER_NONE, Algorithm
from ..tally import Counts, Layout, whole_node
from .counts import counts_for, shape_of

__all__ = [
    "Prediction",
    "predict",
    "price",
    "hidden",
    "rank_algorithms",
    "representatives",
    "classic",
    "TIE",
]

TIE = 0.002  # predictions this close (relative) count as tied


def classic(collective: str) -> list[str]:
    """The flat textbook algorithms of ``collective`` (what an MPI library may run itself)."""
    return [name for name, record in ALGORITHMS[collective].items() if record.classic]


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
    rem = p - (1 << (p.bit_length() - 1))  # pairs a fold to a power of two leaves
    picks |= {max(0, 2 * rem - 2), max(0, 2 * rem - 1), min(p - 1, 2 * rem)}
    for ranks in layout.node_ranks[:2] + layout.node_ranks[-2:]:
        picks |= {ranks[0], ranks[-1]}
    return sorted(picks)


def price(c: Counts, profile: Profile, sharing: int) -> dict[str, float]:
    """Seconds by kind for what one rank sends and reduces.

    Latency per round on the critical path; bandwidth per byte this rank sends or waits
    for (a fold), inter-node bytes times the ranks that share the node's link.
    """
    return {
        "intra": profile.intra.time(c.rounds_intra, c.bytes_intra + c.waited_intra),
        "inter": profile.inter.time(c.rounds_inter, (c.bytes_inter + c.waited_inter) * sharing),
        "reduce": c.reduced_bytes * profile.gamma_s_per_byte,
        "software": profile.call_s + c.rounds * profile.step_s,
    }


def hidden(parts: dict[str, float]) -> float:
    """What a crowded machine hides of hpcpar's Python (shown as a negative overlap).

    The software costs are calibrated on 8-byte calls, where ranks queue for the cores;
    with longer messages that Python runs while the link carries other ranks' messages,
    so it costs only what exceeds the link's time. Copies and reductions stay on the
    path: the next message needs their result. On the 3 x 2 virtual cluster this took
    the model's time for the measured best from 1.28 to 1.08-1.11 at 128 KiB.
    """
    return min(parts["inter"], parts["software"])


def _pipelined(
    record: Algorithm, layout: Layout, rank: int, shape: object, profile: Profile
) -> dict[str, float]:
    """Stages overlap across segments: the first segment pays all, the rest the slowest."""
    stages, segments = record.stages(layout, rank, shape)  # type: ignore[misc]
    priced = [price(c, profile, 1) for c in stages]
    times = [sum(parts.values()) - profile.call_s for parts in priced]
    parts = {
        kind: sum(p[kind] for p in priced) for kind in ("intra", "inter", "reduce", "software")
    }
    parts["software"] -= (len(stages) - 1) * profile.call_s  # one call, not one per stage
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
    record = ALGORITHMS[collective][algorithm]
    if record.counts is None:
        return _library(collective, layout, count, itemsize, profile, root, counts)
    shape = shape_of(
        collective, layout, count, itemsize, root=root, counts=counts, commutative=commutative
    )
    senders = record.senders or whole_node
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
        if record.stages is not None:
            parts = _pipelined(record, layout, rank, shape, profile)
        else:
            parts = price(c, profile, senders(layout, rank))
        if profile.oversubscribed:
            parts["overlap"] = parts.get("overlap", 0.0) - hidden(parts)
        total = sum(parts.values())
        if worst is None or total > worst.seconds:
            worst = Prediction(algorithm, total, parts, rank, None if record.stages else c)
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
            LIBRARY, measured + profile.library_call_s, parts, note="measured in the profile"
        )

    def without_python(pred: Prediction) -> float:  # hpcpar's Python, and what hid it
        hid = hidden(pred.parts) if profile.oversubscribed else 0.0
        return pred.seconds - pred.parts.get("software", 0.0) + hid

    best = min(
        (
            predict(collective, name, layout, count, itemsize, profile, root=root, counts=counts)
            for name in classic(collective)
        ),
        key=without_python,
    )
    seconds = without_python(best) + profile.library_call_s
    parts = {**best.parts, "software": profile.library_call_s}
    if profile.oversubscribed:
        parts["overlap"] = parts.get("overlap", 0.0) + hidden(best.parts)
    return Prediction(
        LIBRARY,
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
            algorithm.order == ORDER_NONE or (algorithm.order != ORDER_ANY and not contiguous)
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
                pred.algorithm != LIBRARY or pred.note.startswith("modelled"),
                pred.messages,
                pred.note.startswith("modelled"),
            ),
        )
        i = j
    return out
