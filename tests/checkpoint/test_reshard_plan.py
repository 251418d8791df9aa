"""A resharding plan, checked without MPI: the moves it makes from the saved manifests
rebuild every restoring rank's block of the global array exactly once, for saved and
restoring rank counts 1-5 (odd ones included), blocks cut along either axis, and
targets given as an axis or as explicit boxes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hpcpar.checkpoint.reshard.plan import (
    LayoutError,
    leaves_of,
    moves_of,
    outputs_of,
    per_rank_problem,
    servers_of,
    target_blocks,
)
from hpcpar.checkpoint.sharding import even_block
from hpcpar.checkpoint.state import LAYOUT, TREE

GLOBAL = np.arange(11 * 7, dtype=np.float64).reshape(11, 7) * 1.5


def saved_state(old: int, axis: int) -> tuple[list[dict], list[np.ndarray]]:
    """Every saved rank's manifest summary and its block, as ``old`` ranks saved them."""
    summaries, blocks = [], []
    for r in range(old):
        offset, shape = even_block(GLOBAL.shape, axis, r, old)
        box = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
        blocks.append(GLOBAL[box])
        layout = {"kind": "sharded", "global": list(GLOBAL.shape), "offset": list(offset)}
        summaries.append(
            {
                TREE: {"value": None},
                "w": {"dtype": GLOBAL.dtype.str, "shape": list(shape)},
                LAYOUT + "w": {"value": json.dumps(layout)},
                "step": {"value": 3},
            }
        )
    return summaries, blocks


def rebuilt(old: int, new: int, axis: int, reshard) -> None:
    summaries, blocks = saved_state(old, axis)
    _, leaves = leaves_of(summaries)
    assert per_rank_problem(leaves, old, new, None) == ""
    every = [target_blocks(leaves, reshard, k, new) for k in range(new)]
    assert all(problem == "" for _, problem in every)
    targets = {"w": [mine["w"] for mine, _ in every]}
    moves = moves_of(leaves, targets, old, new, None)
    for k in range(new):
        (offset, shape) = targets["w"][k]
        outputs, values = outputs_of(
            leaves, targets, k, new, old, None, lambda key, s, d: np.full(s, np.nan, d)
        )
        assert values == {"step": 3}
        out, hits = outputs["w"], np.zeros(shape, dtype=int)
        for name, r, src, box, client, key, dst in moves:
            if client != k:
                continue
            assert name == key == "w"
            into = tuple(slice(d, d + n) for d, n in zip(dst, box, strict=True))
            out[into] = blocks[r][tuple(slice(s, s + n) for s, n in zip(src, box, strict=True))]
            hits[into] += 1
        want = GLOBAL[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]
        assert np.array_equal(out, want), (old, new, k)
        assert (hits == 1).all(), f"rank {k} of {new}: elements written {hits.min()}-{hits.max()}x"


@pytest.mark.parametrize("old", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("new", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("axis", [0, 1])
def test_the_moves_rebuild_every_target_block_once(old, new, axis):
    rebuilt(old, new, axis, None)  # near-equal blocks along the saved axis
    rebuilt(old, new, axis, 1 - axis)  # cut along the other axis


def test_explicit_boxes_and_servers():
    def box(name, shape):
        return ((2, 1), (5, 4))  # every rank wants the same box

    rebuilt(3, 2, 0, box)
    summaries, _ = saved_state(3, 0)
    _, leaves = leaves_of(summaries)
    targets = {"w": [even_block(GLOBAL.shape, 0, k, 3) for k in range(3)]}
    seen = [{r: ["local"] for r in range(3)} for _ in range(3)]
    servers = servers_of(leaves, targets, seen, dict.fromkeys(range(3), "local"), 3, 3)
    assert servers == {0: 0, 1: 1, 2: 2}  # each saved block is read by the rank that needs it


def test_plans_that_cannot_be_made_say_why():
    summaries, _ = saved_state(3, 0)
    _, leaves = leaves_of(summaries)
    _, problem = target_blocks(leaves, ((0, 0), (12, 7)), 1, 2)
    assert problem.startswith("rank 1: restore:") and "12" in problem
    summaries[1]["step"] = {"value": 4}  # a plain value that differs between saved ranks
    _, leaves = leaves_of(summaries)
    assert "'step'" in per_rank_problem(leaves, 3, 2, None)
    assert per_rank_problem(leaves, 3, 2, "all") == ""
    summaries[2][TREE] = {"value": ["other"]}
    with pytest.raises(LayoutError, match="different structures"):
        leaves_of(summaries)
