"""Layout parsing and node assignment (pure, no MPI)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcpar.errors import LayoutError
from hpcpar.layout import format_ranks, node_assignment, parse_layout


@pytest.mark.parametrize(
    ("spec", "size", "expected"),
    [
        ("ppn:2", 4, [0, 0, 1, 1]),
        ("ppn:2", 3, [0, 0, 1]),
        ("ppn:4", 2, [0, 0]),
        ("ppn:1", 3, [0, 1, 2]),
        ("nodes:3,2,2", 7, [0, 0, 0, 1, 1, 2, 2]),
        ("nodes:1,3", 4, [0, 1, 1, 1]),
        ("roundrobin:2", 5, [0, 1, 0, 1, 0]),
        ("roundrobin:3", 3, [0, 1, 2]),
        (" PPN : 2 ", 2, [0, 0]),
    ],
)
def test_node_assignment(spec, size, expected):
    assert node_assignment(spec, size) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "ppn",
        "ppn:",
        "ppn:0",
        "ppn:-1",
        "ppn:x",
        "ppn:2,2",
        "nodes:",
        "nodes:1,,2",
        "nodes:0,2",
        "grid:2",
        "roundrobin:1.5",
        "roundrobin:2,3",
    ],
)
def test_malformed_layouts_are_one_line_errors(spec):
    with pytest.raises(LayoutError) as info:
        parse_layout(spec)
    message = str(info.value)
    assert "\n" not in message
    assert repr(spec) in message


@pytest.mark.parametrize(
    ("spec", "size"), [("nodes:2,1", 4), ("nodes:3,3", 4), ("roundrobin:5", 4)]
)
def test_layout_not_matching_the_job_names_both_sizes(spec, size):
    with pytest.raises(LayoutError, match=str(size)):
        node_assignment(spec, size)


@given(st.lists(st.integers(1, 6), min_size=1, max_size=8))
def test_nodes_layout_reproduces_the_given_sizes(sizes):
    spec = "nodes:" + ",".join(map(str, sizes))
    nodes = node_assignment(spec, sum(sizes))
    assert [nodes.count(i) for i in range(len(sizes))] == sizes
    assert nodes == sorted(nodes)


@given(st.sampled_from(["ppn", "roundrobin"]), st.integers(1, 9), st.integers(1, 40))
def test_nodes_are_numbered_by_their_lowest_rank(kind, k, size):
    if kind == "roundrobin" and k > size:
        return
    nodes = node_assignment(f"{kind}:{k}", size)
    first_rank = {}
    for rank, node in enumerate(nodes):
        first_rank.setdefault(node, rank)
    assert sorted(first_rank, key=first_rank.get) == list(range(max(nodes) + 1))
    assert all(nodes.count(n) >= 1 for n in range(max(nodes) + 1))


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], ""),
        ([3], "3"),
        ([0, 1], "0,1"),
        ([0, 1, 2], "0-2"),
        ([0, 1, 2, 5, 7, 8, 9], "0-2,5,7-9"),
        ([0, 2, 4], "0,2,4"),
    ],
)
def test_format_ranks(ranks, text):
    assert format_ranks(ranks) == text
