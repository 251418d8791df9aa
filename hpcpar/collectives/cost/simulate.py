"""Predict every algorithm on machines we do not have: sizes x scales -> the winner."""

from __future__ import annotations

from dataclasses import dataclass

from ...runtime.profile import Profile
from ..algorithms import ALGORITHMS
from ..registry import LIBRARY
from ..tally import Layout
from .model import predict

__all__ = ["SimulationRow", "simulate", "labels"]


def labels(collective: str) -> dict[str, str]:
    """Each algorithm's short label, for tables (from its record)."""
    return {name: record.label for name, record in ALGORITHMS[collective].items()}


@dataclass(frozen=True)
class SimulationRow:
    """One algorithm's prediction at one size and scale."""

    nodes: int
    ppn: int
    nbytes: int
    algorithm: str
    seconds: float
    winner: bool


def _layout(nodes: int, ppn: int) -> Layout:
    return Layout(tuple(r // ppn for r in range(nodes * ppn)))


def simulate(
    collective: str,
    node_counts: list[int],
    ppn: int,
    sizes: list[int],
    profile: Profile,
    itemsize: int = 8,
) -> list[SimulationRow]:
    """Predict every hpcpar algorithm at every size and node count.

    The library's own call is left out: no timing table exists for a machine that is
    only simulated.
    """
    rows: list[SimulationRow] = []
    names = [name for name in ALGORITHMS[collective] if name != LIBRARY]
    for nodes in node_counts:
        layout = _layout(nodes, ppn)
        for nbytes in sizes:
            count = nbytes // itemsize
            if collective == "alltoall":
                count -= count % layout.size
            preds = [predict(collective, name, layout, count, itemsize, profile) for name in names]
            best = min(preds, key=lambda pred: pred.seconds)
            rows += [
                SimulationRow(nodes, ppn, nbytes, pred.algorithm, pred.seconds, pred is best)
                for pred in preds
            ]
    return rows
