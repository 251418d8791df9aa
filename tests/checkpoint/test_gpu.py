"""Device (cupy) arrays in checkpoints: pinned-memory snapshot on a copy stream, restore.

Runs only where cupy and a GPU are present (the device machine); skipped elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest
from hpcpar.checkpoint import Checkpointer


def _cupy():
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no cupy, no driver or no device: all mean "skip"
        return None
    return cupy


cupy = _cupy()
pytestmark = pytest.mark.skipif(cupy is None, reason="needs cupy and a GPU")


@pytest.mark.parametrize("lazy", [False, True])
def test_device_state_round_trip(tmp_path, lazy):
    w = cupy.arange(1 << 20, dtype=cupy.float32) * 0.5
    v = cupy.random.default_rng(1).standard_normal((300, 7))[:, ::2]  # not contiguous
    expect_w, expect_v = cupy.asnumpy(w), cupy.asnumpy(v)
    with Checkpointer(tmp_path / "ck", levels=["memory", "local"]) as ck:
        handle = ck.save(1, {"w": w, "opt": {"v": v}, "step": 1}, lazy=lazy)
        handle.wait_snapshot()
        w += 1  # after the snapshot the caller may change its device arrays
        handle.wait()
        step, state = ck.restore()
        assert step == 1 and ck.restored_from == ["memory"]
        assert np.array_equal(state["w"], expect_w) and np.array_equal(state["opt"]["v"], expect_v)
    with Checkpointer(tmp_path / "ck", levels=["local"]) as ck:
        step, state = ck.restore()
        assert ck.restored_from == ["local"]
        assert np.array_equal(state["w"], expect_w) and np.array_equal(state["opt"]["v"], expect_v)


def test_device_blocks_save_as_sharded_and_replicated_and_reshard(tmp_path):
    """Sharded and Replicated device arrays: snapshotted from the GPU, restored (as numpy)
    whole, and resharded into any target block."""
    from hpcpar.checkpoint import Replicated, Sharded

    g = cupy.arange(12 * 5, dtype=cupy.float64).reshape(12, 5)
    expect = cupy.asnumpy(g)
    model = cupy.linspace(0, 1, 33)
    state = {"g": Sharded(g, g.shape, (0, 0)), "model": Replicated(model), "meta": [1, (2, 3)]}
    with Checkpointer(tmp_path / "ck", levels=["memory", "local"]) as ck:
        ck.save(1, state).wait()
    with Checkpointer(tmp_path / "ck", levels=["local"]) as ck:
        _, got = ck.restore()
        assert np.array_equal(np.asarray(got["g"]), expect)
        assert np.array_equal(np.asarray(got["model"]), cupy.asnumpy(model))
        assert got["meta"] == [1, (2, 3)]
        _, part = ck.restore(reshard={"g": ((3, 1), (6, 4))})
        assert part["g"].offset == (3, 1)
        assert np.array_equal(part["g"].block, expect[3:9, 1:5])
