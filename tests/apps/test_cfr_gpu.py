"""CFR on the GPU (cupy) gives the CPU results; runs only where cupy and a GPU exist."""

from __future__ import annotations

import pytest
from hpcpar.apps.cfr import Solver, build_tree


def _gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver or no device: all mean "skip"
        return False


@pytest.mark.skipif(not _gpu(), reason="needs cupy and a GPU")
@pytest.mark.parametrize("algorithm", ["cfr", "dcfr", "pcfr+"])
def test_gpu_equals_cpu(algorithm):
    tree = build_tree("leduc_poker")
    cpu, gpu = Solver(tree, algorithm), Solver(tree, algorithm, device="gpu")
    cpu.iterate(20)
    gpu.iterate(20)
    assert abs(cpu.nash_conv() - gpu.nash_conv()) < 1e-12
