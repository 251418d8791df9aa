"""Virtual node layouts: which node each rank is on, as pure functions (no MPI).

A layout string puts the ranks of one host onto virtual nodes so hierarchical
algorithms can be tested and studied without a cluster:

- ``ppn:K``         consecutive blocks of K ranks; the last node holds the remainder.
- ``nodes:3,2,2``   explicit node sizes in rank order; they must add up to the job size.
- ``roundrobin:K``  rank r on node r % K (K nodes, at most one more rank on the first).
- ``map:0,1,0,1``   the node of every rank, in rank order (how ``Hierarchy.split``
  hands a sub-communicator its share of a layout).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LayoutError

__all__ = ["Layout", "parse_layout", "node_assignment", "format_ranks"]

_FORMS = "expected ppn:K, nodes:A,B,... or roundrobin:K with positive integers, or map:N0,N1,..."


@dataclass(frozen=True)
class Layout:
    """A parsed layout string.

    Attributes:
        kind: ``"ppn"``, ``"nodes"`` or ``"roundrobin"``.
        values: K for ppn and roundrobin; the node sizes for nodes.
    """

    kind: str
    values: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.kind}:{','.join(map(str, self.values))}"


def _positive_ints(spec: str, text: str, least: int = 1) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or not all(p.isdigit() and int(p) >= least for p in parts):
        raise LayoutError(f"malformed layout {spec!r}: {_FORMS}")
    return tuple(int(p) for p in parts)


def parse_layout(spec: str) -> Layout:
    """Parse a layout string.

    Raises:
        LayoutError: the string is not one of the three forms.
    """
    kind, sep, rest = spec.strip().partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in ("ppn", "nodes", "roundrobin", "map"):
        raise LayoutError(f"malformed layout {spec!r}: {_FORMS}")
    values = _positive_ints(spec, rest, least=0 if kind == "map" else 1)
    if kind in ("ppn", "roundrobin") and len(values) != 1:
        raise LayoutError(f"malformed layout {spec!r}: {kind} takes one number ({_FORMS})")
    return Layout(kind, values)


def node_assignment(spec: str | Layout, size: int) -> list[int]:
    """Return the node index of every rank of a job of ``size`` ranks.

    Node indices are numbered in the order of each node's lowest rank, so node i's
    leader (its lowest rank) is the i-th leader in rank order.

    Raises:
        LayoutError: the layout is malformed or does not fit ``size`` ranks.
    """
    layout = spec if isinstance(spec, Layout) else parse_layout(spec)
    if layout.kind == "ppn":
        (k,) = layout.values
        return [r // k for r in range(size)]
    if layout.kind == "roundrobin":
        (k,) = layout.values
        if k > size:
            raise LayoutError(
                f"layout {layout} has {k} nodes but the job has only {size} rank(s); "
                "every node needs at least one rank"
            )
        return [r % k for r in range(size)]
    if layout.kind == "map":
        if len(layout.values) != size:
            raise LayoutError(
                f"layout map:... names the node of {len(layout.values)} "
                f"rank(s) but the job has {size}"
            )
        number: dict[int, int] = {}  # renumbered in the order of each node's lowest rank
        return [number.setdefault(node, len(number)) for node in layout.values]
    total = sum(layout.values)
    if total != size:
        raise LayoutError(
            f"layout {layout} places {total} rank(s) but the job has {size}; "
            "the node sizes must add up to the number of ranks"
        )
    return [node for node, count in enumerate(layout.values) for _ in range(count)]


def format_ranks(ranks: list[int]) -> str:
    """Format a sorted rank list compactly: ``[0, 1, 2, 5, 7, 9]`` -> ``"0-2,5,7,9"``."""
    out: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if j < i + 2 else f"{ranks[i]}-{ranks[j]}")
        if 0 < j - i < 2:
            out.extend(str(r) for r in ranks[i + 1 : j + 1])
        i = j + 1
    return ",".join(out)
