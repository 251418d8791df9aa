"""The node hierarchy of a job: node, leader and rail communicators, real or virtual."""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from .errors import LayoutError
from .layout import format_ranks, node_assignment, parse_layout
from .runtime import settings
from .runtime.comm import resolve_comm

__all__ = ["Hierarchy"]


class Hierarchy:
    """Which ranks share a node, and the communicators hierarchical algorithms need.

    Creating one is collective over ``comm``. Nodes are numbered in the order of their
    lowest rank; a node's leader is its lowest rank (local rank 0).

    Attributes:
        comm: The communicator the hierarchy describes.
        node: The ranks of this rank's node, ordered by rank.
        leaders: Local rank 0 of every node, ordered by node; ``None`` on other ranks.
        rail: The ranks with this rank's local rank, one per node that has it.
        layout: The virtual layout string, or ``None`` for the real nodes.
        node_of: The node index of every rank of ``comm``.
        node_names: A name per node (host name, or ``vnodeI`` for virtual nodes).

    Args:
        comm: ``None`` (hpcpar's default communicator) or an intra-communicator.
        layout: ``None`` for the real nodes (or ``HPCPAR_LAYOUT`` when set), or a
            layout string: ``"ppn:2"``, ``"nodes:3,2,2"``, ``"roundrobin:2"``.

    Raises:
        LayoutError: the layout is malformed, does not fit the job, or the ranks were
            given different layouts.
    """

    def __init__(self, comm: Any = None, layout: str | None = None) -> None:
        self.comm: MPI.Intracomm = resolve_comm(comm)
        if layout is None:
            layout = settings.value("HPCPAR_LAYOUT") or None
        self.layout = self._agreed_layout(layout)
        rank = self.comm.Get_rank()
        if self.layout is None:
            self.node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
            self.node_of = self._real_node_of()
        else:
            self.node_of = node_assignment(self.layout, self.comm.Get_size())
            self.node = self.comm.Split(self.node_of[rank], rank)
        self.node.Set_name(f"hpcpar-node{self.node_of[rank]}")
        local_rank = self.node.Get_rank()
        leaders = self.comm.Split(0 if local_rank == 0 else MPI.UNDEFINED, rank)
        self.leaders: MPI.Intracomm | None = None if leaders == MPI.COMM_NULL else leaders
        self.rail = self.comm.Split(local_rank, rank)
        self.node_names = self._node_names()

    def _agreed_layout(self, layout: str | None) -> str | None:
        # Every rank learns every rank's parse result first, so a layout that is bad
        # on some ranks only raises on all of them instead of leaving the rest blocked.
        try:
            mine, error = (str(parse_layout(layout)) if layout else None), None
        except LayoutError as exc:
            mine, error = layout, str(exc)
        seen = self.comm.allgather((mine, error))
        bad = [r for r, (_, err) in enumerate(seen) if err]
        if bad:
            where = "" if len(bad) == len(seen) else f" (on ranks {format_ranks(bad)})"
            raise LayoutError(f"{seen[bad[0]][1]}{where}")
        if len({spec for spec, _ in seen}) > 1:
            groups: dict[str | None, list[int]] = {}
            for r, (spec, _) in enumerate(seen):
                groups.setdefault(spec, []).append(r)
            detail = "; ".join(
                f"ranks {format_ranks(rs)}: {spec or 'real nodes'}" for spec, rs in groups.items()
            )
            raise LayoutError(f"ranks were given different layouts ({detail})")
        return mine

    def _real_node_of(self) -> list[int]:
        # The leader's rank in comm identifies a node; number nodes by leader order.
        leader = self.node.bcast(self.comm.Get_rank(), root=0)
        leader_of = self.comm.allgather(leader)
        index = {lead: i for i, lead in enumerate(sorted(set(leader_of)))}
        return [index[lead] for lead in leader_of]

    def _node_names(self) -> list[str]:
        if self.layout is not None:
            return [f"vnode{i}" for i in range(self.n_nodes)]
        name = MPI.Get_processor_name() if self.local_rank == 0 else None
        names = self.comm.allgather(name)
        return [names[self.ranks_of_node(i)[0]] for i in range(self.n_nodes)]

    @property
    def size(self) -> int:
        """Number of ranks in ``comm``."""
        return self.comm.Get_size()

    @property
    def rank(self) -> int:
        """This rank in ``comm``."""
        return self.comm.Get_rank()

    @property
    def n_nodes(self) -> int:
        """Number of (real or virtual) nodes."""
        return max(self.node_of) + 1

    @property
    def node_index(self) -> int:
        """Index of this rank's node."""
        return self.node_of[self.rank]

    @property
    def local_rank(self) -> int:
        """This rank's position on its node."""
        return self.node.Get_rank()

    @property
    def local_size(self) -> int:
        """Number of ranks on this rank's node."""
        return self.node.Get_size()

    @property
    def is_leader(self) -> bool:
        """Whether this rank is its node's leader (local rank 0)."""
        return self.leaders is not None

    @property
    def node_sizes(self) -> list[int]:
        """Number of ranks on every node, by node index."""
        sizes = [0] * self.n_nodes
        for node in self.node_of:
            sizes[node] += 1
        return sizes

    @property
    def is_uneven(self) -> bool:
        """Whether the nodes hold different numbers of ranks."""
        return len(set(self.node_sizes)) > 1

    def ranks_of_node(self, index: int) -> list[int]:
        """Ranks of ``comm`` on node ``index``, in rank order."""
        return [r for r, node in enumerate(self.node_of) if node == index]

    def describe(self) -> str:
        """Return the topology as a table: one row per node."""
        source = f"layout {self.layout}" if self.layout else "real nodes"
        shape = "uneven" if self.is_uneven else "even"
        lines = [
            f"hpcpar topology: {self.size} rank(s) on {self.n_nodes} node(s), {shape} ({source})",
            f"{'node':>4}  {'name':<20} {'size':>4}  {'leader':>6}  ranks",
        ]
        width = max(len(n) for n in self.node_names)
        for i in range(self.n_nodes):
            ranks = self.ranks_of_node(i)
            name = self.node_names[i][: max(20, width)]
            lines.append(
                f"{i:>4}  {name:<20} {len(ranks):>4}  {ranks[0]:>6}  {format_ranks(ranks)}"
            )
        return "\n".join(lines)

    def split(self, color: int, key: int = 0) -> Hierarchy:
        """The hierarchy of ``comm.Split(color, key)``: each rank keeps its node (collective).

        A plain communicator from ``Split`` would make hpcpar's collectives read
        ``HPCPAR_LAYOUT`` afresh for it (a layout meant for the whole job); this passes the
        sub-communicator exactly the nodes its ranks are on, as a ``map:`` layout. The
        caller owns the new communicator: ``sub.free()`` then ``sub.comm.Free()``.
        """
        sub = self.comm.Split(color, key)
        node = self.node_of[self.comm.Get_rank()]
        nodes = sub.allgather(node)
        return Hierarchy(sub, layout="map:" + ",".join(map(str, nodes)))

    def free(self) -> None:
        """Free the node, leader and rail communicators (collective)."""
        for name in ("node", "leaders", "rail"):
            comm = getattr(self, name, None)
            if comm is not None and comm != MPI.COMM_NULL:
                comm.Free()
            setattr(self, name, None)

    def __enter__(self) -> Hierarchy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        source = self.layout or "real"
        return f"Hierarchy(size={self.size}, nodes={self.node_sizes}, layout={source!r})"
