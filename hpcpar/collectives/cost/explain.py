"""``explain()``: which algorithm a collective call gets, what the model predicts, and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...runtime.profile import Profile, active_profile, default_profile
from ..algorithms import ALGORITHMS
from ..errors import CollectiveError
from ..names import COLLECTIVES
from ..registry import LIBRARY
from ..tally import Layout
from .model import TIE, Prediction, rank_algorithms

__all__ = ["Plan", "explain", "plan_for", "auto_choice", "scheme_for_call"]


@dataclass
class Plan:
    """The answer of ``explain``.

    Attributes:
        collective: The collective explained.
        nbytes: Message size in bytes (per rank; the full vector for reductions).
        algorithm: What ``algorithm="auto"`` runs.
        reason: Why, in one sentence.
        predicted_s: The model's time for the model's choice.
        ranking: Every valid algorithm, fastest predicted first.
        segment_bytes: Segment size when the choice runs in segments.
        profile: The profile's name.
        ranks: Ranks in the job; nodes: nodes in the layout.
        compression: With ``compression=``: the scheme the call codes with
            (``"exact"``: none), ``compression_reason`` why, and ``schemes`` the exact
            allreduce and every scheme, fastest predicted first, with their bounds.
    """

    collective: str
    nbytes: int
    algorithm: str
    reason: str
    predicted_s: float
    ranking: list[Prediction] = field(default_factory=list)
    segment_bytes: int | None = None
    profile: str = ""
    ranks: int = 1
    nodes: int = 1
    compression: str | None = None
    compression_reason: str = ""
    schemes: list[Any] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"explain {self.collective} of {self.nbytes} bytes on {self.ranks} rank(s), "
            f"{self.nodes} node(s); profile: {self.profile}",
            f"auto runs: {self.algorithm}",
            f"reason:    {self.reason}",
        ]
        if self.segment_bytes:
            lines.append(f"segments:  {self.segment_bytes} bytes")
        lines.append(
            f"{'algorithm':<20}{'predicted us':>14}{'intra us':>10}{'inter us':>10}"
            f"{'reduce us':>10}{'software us':>12}{'overlap us':>11}  note"
        )
        for pred in self.ranking:
            p = pred.parts
            cells = [
                p.get(k, 0.0) * 1e6 for k in ("intra", "inter", "reduce", "software", "overlap")
            ]
            lines.append(
                f"{pred.algorithm:<20}{pred.seconds * 1e6:>14.1f}"
                + "".join(f"{v:>10.1f}" for v in cells[:3])
                + f"{cells[3]:>12.1f}{cells[4]:>11.1f}  {pred.note}"
            )
        if self.compression is not None:
            lines += [
                f"compression: {self.compression}",
                f"reason:    {self.compression_reason}",
                f"{'scheme':<20}{'predicted us':>14}{'inter bytes':>12}{'codec us':>10}"
                f"{'error bound':>13}",
            ]
            for entry in self.schemes:
                pred = entry.prediction
                lines.append(
                    f"{entry.scheme:<20}{pred.seconds * 1e6:>14.1f}"
                    f"{'-' if entry.wire_bytes is None else entry.wire_bytes:>12}"
                    f"{pred.parts.get('codec', 0.0) * 1e6:>10.1f}{entry.bound:>13.3g}"
                )
        return "\n".join(lines)


def plan_for(
    collective: str,
    nbytes: int,
    layout: Layout,
    profile: Profile | None = None,
    *,
    itemsize: int = 8,
    commutative: bool = True,
    calibrated_only: bool = True,
    compression: Any = None,
) -> Plan:
    """The plan for a call of ``nbytes`` bytes on ``layout`` (pure; no MPI).

    Args:
        collective: Which collective.
        nbytes: Bytes per rank (the whole vector for allreduce, reduce, bcast,
            reduce_scatter; one rank's block for allgather; the send buffer for alltoall).
        layout: The node of every rank.
        profile: The machine profile (``HPCPAR_PROFILE``, else the default one).
        itemsize: Element size.
        commutative: Whether the op is commutative.
        calibrated_only: Follow the model only with a calibrated profile (what
            ``auto`` does); otherwise report the model's choice anyway.
        compression: A ``Compression`` (allreduce only): also rank the exact allreduce
            and every scheme, and say which one the call codes with.
    """
    if nbytes < 0:
        raise CollectiveError(f"explain: size must be >= 0 bytes, not {nbytes}")
    active = profile or active_profile() or default_profile()
    count = nbytes // itemsize
    p = layout.size
    counts = [count] * p if collective == "allgather" else None
    if collective == "alltoall":
        count = count - count % p
    contiguous = list(layout.node_of) == sorted(layout.node_of)
    ranking = rank_algorithms(
        collective,
        layout,
        count,
        itemsize,
        active,
        commutative=commutative,
        contiguous=contiguous,
        counts=counts,
    )
    best = ranking[0]
    follow = active.calibrated or not calibrated_only
    if collective == "alltoallv":
        chosen, reason = (
            LIBRARY,
            "alltoallv sizes differ per rank, so auto keeps the library's call",
        )
    elif follow:
        runner = ranking[1] if len(ranking) > 1 else None
        chosen = best.algorithm
        reason = f"fastest predicted ({best.seconds * 1e6:.1f} us)" + (
            f"; next {runner.algorithm} at {runner.seconds * 1e6:.1f} us" if runner else ""
        )
        if runner and runner.seconds <= best.seconds * (1 + TIE) and runner.algorithm != LIBRARY:
            reason += (
                f" (a tie within {TIE:.1%}: fewer messages over all ranks, "
                f"{best.messages} against {runner.messages})"
            )
        library = next((pred for pred in ranking if pred.algorithm == LIBRARY), None)
        if chosen != LIBRARY and library and best.seconds >= library.seconds * (1 - active.margin):
            chosen = LIBRARY
            reason = (
                f"{best.algorithm} is predicted fastest ({best.seconds * 1e6:.1f} us) but not "
                f"{active.margin:.0%} faster than the MPI library's call "
                f"({library.seconds * 1e6:.1f} us), so the library's (the profile's margin; "
                f"autotune=True times the candidates and the library on first use)"
            )
    else:
        chosen = LIBRARY
        reason = (
            f"no calibrated profile (run 'hpcpar calibrate' and set HPCPAR_PROFILE), so the "
            f"MPI library's own call; the default model would pick {best.algorithm}"
        )
    cut = ALGORITHMS[collective][chosen].segment_bytes
    segment = cut(itemsize) if cut is not None else None
    plan = Plan(
        collective,
        nbytes,
        chosen,
        reason,
        best.seconds,
        ranking,
        segment,
        active.name,
        p,
        len(layout.node_ranks),
    )
    if compression is not None:
        if collective != "allreduce":
            raise CollectiveError(f"explain: compression applies to allreduce, not {collective}")
        from .compressed import scheme_plan

        exact = next(p for p in ranking if p.algorithm == chosen)
        plan.compression, plan.compression_reason, plan.schemes = scheme_plan(
            compression, layout, count, itemsize, active, exact
        )
    return plan


def explain(
    collective: str,
    nbytes: int,
    comm: Any = None,
    *,
    itemsize: int = 8,
    op: Any = None,
    compression: Any = None,
    tolerance: float | None = None,
) -> Plan:
    """Explain the algorithm ``auto`` chooses for ``collective`` of ``nbytes`` on ``comm``.

    With ``compression=`` (and ``tolerance=``, as ``hpcpar.allreduce`` takes them) the
    plan also ranks the exact allreduce and every compression scheme with its predicted
    time and error bound, and says which one the call would code with.

    Collective the first time hpcpar uses ``comm`` (it builds the hierarchy), local after.
    """
    from ..ops import resolve_op
    from ..state import state_for

    if collective not in COLLECTIVES:
        raise CollectiveError(
            f"explain: unknown collective {collective!r}; choose allreduce, reduce, bcast, "
            "allgather, reduce_scatter, alltoall, alltoallv or barrier"
        )
    state = state_for(comm)
    commutative = True
    if op is not None:
        import numpy as np

        commutative = resolve_op(op, np.dtype(np.float64)).commutative
    layout = Layout(tuple(state.node_of))
    spec = None
    if compression is not None or tolerance is not None:
        from ..compression import as_compression

        spec = as_compression(compression, tolerance)
    return plan_for(
        collective,
        nbytes,
        layout,
        itemsize=itemsize,
        commutative=commutative,
        compression=spec,
    )


def auto_choice(
    collective: str, state: Any, nbytes: int, itemsize: int, commutative: bool
) -> tuple[str, str]:
    """What ``auto`` runs: a rule (``HPCPAR_RULES``), else the model, else the library.

    The model's choice is cached per communicator, size class and op kind.
    """
    from .rules import active_rules, match_rule

    rules = active_rules()
    if rules:
        nodes = max(state.node_of) + 1
        ruled = match_rule(rules, collective, nbytes, state.size, nodes)
        if ruled is not None:
            return (
                ruled,
                f"auto: rule in HPCPAR_RULES ({ruled} for {nbytes} bytes on {state.size} ranks)",
            )
    profile = active_profile()
    if profile is None or not profile.calibrated or collective == "alltoallv":
        return LIBRARY, "auto: the MPI library's own call (no calibrated profile in HPCPAR_PROFILE)"
    key = (collective, nbytes.bit_length(), itemsize, commutative, profile.name)
    cache = state.auto_cache
    if key not in cache:
        plan = plan_for(
            collective,
            nbytes,
            Layout(tuple(state.node_of)),
            profile,
            itemsize=itemsize,
            commutative=commutative,
        )
        cache[key] = (plan.algorithm, f"auto: cost model, {plan.reason}")
    return cache[key]


def scheme_for_call(spec: Any, state: Any, count: int, itemsize: int) -> tuple[str, str]:
    """The compression scheme a call with ``spec`` runs ("exact": none) and why.

    A named scheme without a tolerance runs as asked (on more than one node);
    otherwise the plan decides, cached per communicator and size class.
    """
    from .compressed import ONE_NODE

    layout = Layout(tuple(state.node_of))
    if len(layout.node_ranks) <= 1:
        return "exact", ONE_NODE
    if spec.scheme != "auto" and spec.tolerance is None:
        return spec.scheme, f"compression={spec.scheme!r} was requested"
    profile = active_profile() or default_profile()
    key = ("compression", count.bit_length(), itemsize, spec, profile.name)
    cache = state.auto_cache
    if key not in cache:
        plan = plan_for(
            "allreduce",
            count * itemsize,
            layout,
            profile,
            itemsize=itemsize,
            compression=spec,
        )
        cache[key] = (plan.compression, plan.compression_reason)
    return cache[key]
