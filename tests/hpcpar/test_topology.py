"""Hierarchy at any rank count, every layout kind, checked by an independent computation."""

from __future__ import annotations

import pytest
from mpi4py import MPI

import hpcpar
from hpcpar.errors import LayoutError
from hpcpar.testing import assert_all, layouts_for

pytestmark = pytest.mark.mpi


def expected_nodes(layout: str | None, size: int, comm) -> list[int]:
    """Node of each rank, computed without hpcpar.layout."""
    if layout is None:  # real nodes: ranks with the same processor name share a node
        names = comm.allgather(MPI.Get_processor_name())
        order = list(dict.fromkeys(names))
        return [order.index(n) for n in names]
    kind, value = layout.split(":")
    if kind == "ppn":
        return [r // int(value) for r in range(size)]
    if kind == "roundrobin":
        return [r % int(value) for r in range(size)]
    out: list[int] = []
    for node, count in enumerate(int(v) for v in value.split(",")):
        out += [node] * count
    return out


def members(sub, parent) -> list[int]:
    """Ranks of ``parent`` that make up ``sub`` (through MPI groups)."""
    group, parent_group = sub.Get_group(), parent.Get_group()
    ranks = MPI.Group.Translate_ranks(group, list(range(sub.Get_size())), parent_group)
    group.Free()
    parent_group.Free()
    return list(ranks)


@pytest.mark.parametrize("layout", layouts_for(MPI.COMM_WORLD.Get_size()))
def test_hierarchy_matches_layout(comm, layout):
    size, rank = comm.Get_size(), comm.Get_rank()
    nodes = expected_nodes(layout, size, comm)
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        mine = [r for r in range(size) if nodes[r] == nodes[rank]]
        local = mine.index(rank)
        leaders = [min(r for r in range(size) if nodes[r] == n) for n in range(max(nodes) + 1)]
        rail = [
            r
            for r in range(size)
            if sorted(q for q in range(size) if nodes[q] == nodes[r]).index(r) == local
        ]
        checks = [
            members(h.node, comm) == mine,
            h.local_rank == local and h.local_size == len(mine),
            h.node_index == nodes[rank] and h.n_nodes == max(nodes) + 1,
            h.node_sizes == [nodes.count(n) for n in range(max(nodes) + 1)],
            h.is_leader == (rank in leaders),
            h.leaders is None or members(h.leaders, comm) == leaders,
            h.leaders is None or h.leaders.Get_rank() == h.node_index,
            members(h.rail, comm) == rail,
            h.node_of == nodes,
            h.is_uneven == (len(set(h.node_sizes)) > 1),
        ]
        assert_all(all(checks), f"hierarchy for layout {layout}: checks {checks}", comm)
        text = h.describe()
        assert_all(text.count("\n") == 1 + h.n_nodes and f"{size} rank(s)" in text, text, comm)


def test_layout_from_environment(comm, monkeypatch):
    monkeypatch.setenv("HPCPAR_LAYOUT", "ppn:1")
    with hpcpar.Hierarchy(comm) as h:
        assert_all(
            h.n_nodes == comm.Get_size() and h.layout == "ppn:1", "HPCPAR_LAYOUT ignored", comm
        )


def test_default_comm_and_explicit_world_agree(comm):
    with hpcpar.Hierarchy() as h, hpcpar.Hierarchy(MPI.COMM_WORLD) as w:
        assert_all(h.node_of == w.node_of, "default and world hierarchies differ", comm)
        assert_all(h.comm is hpcpar.default_comm(), "comm=None is not the default comm", comm)


@pytest.mark.parametrize("layout", ["ppn:0", "nodes:1,2,3,4,5", "mesh:2"])
def test_bad_layout_raises_on_every_rank(comm, layout):
    with pytest.raises(LayoutError):
        hpcpar.Hierarchy(comm, layout=layout)


def test_different_layouts_on_different_ranks_raise_everywhere(comm):
    if comm.Get_size() == 1:
        pytest.skip("needs two ranks to disagree")
    layout = "ppn:1" if comm.Get_rank() == 0 else "ppn:2"
    with pytest.raises(LayoutError, match="different layouts"):
        hpcpar.Hierarchy(comm, layout=layout)


def test_bad_layout_on_one_rank_only_raises_everywhere(comm):
    layout = "ppn:x" if comm.Get_rank() == comm.Get_size() - 1 else "ppn:1"
    with pytest.raises(LayoutError, match="malformed"):
        hpcpar.Hierarchy(comm, layout=layout)


def test_hierarchy_on_a_subcommunicator(comm):
    sub = comm.Split(comm.Get_rank() % 2, comm.Get_rank())
    with hpcpar.Hierarchy(sub, layout="ppn:1") as h:
        assert_all(
            h.size == sub.Get_size() and h.n_nodes == sub.Get_size(), "sub-communicator", comm
        )
    sub.Free()
