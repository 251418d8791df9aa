"""PyTorch models on CUDA through ``DataParallel``: gradient buckets on the device handed
to hpcpar as cupy arrays (DLPack); the same model as on the CPU. Runs only where torch
has CUDA and cupy a GPU (the device machine's check); skipped elsewhere."""

from __future__ import annotations

import pytest

import hpcpar
from hpcpar.testing import assert_all

torch = pytest.importorskip("torch", reason="the torch front end needs torch (pip install torch)")


def _cuda() -> bool:
    try:
        import cupy

        return torch.cuda.is_available() and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver or no device: all mean "skip"
        return False


pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not _cuda(), reason="needs torch with CUDA, cupy and a GPU"),
]


@pytest.mark.parametrize("overlap", [True, False])
def test_gpu_buckets_train_the_cpu_model(comm, overlap):
    from hpcpar.apps.sgd.torch import DataParallel

    def train(device, wrap):
        torch.manual_seed(0)
        net = (
            torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
            .double()
            .to(device)
        )
        model = wrap(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        for _ in range(5):
            x = torch.randn(24, 10, generator=g, dtype=torch.float64)
            y = torch.randint(0, 3, (24,), generator=g)
            share = 24 // comm.Get_size()
            rows = slice(comm.Get_rank() * share, (comm.Get_rank() + 1) * share)
            loss = torch.nn.functional.cross_entropy(model(x[rows].to(device)), y[rows].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return torch.cat([p.detach().cpu().reshape(-1) for p in net.parameters()])

    with hpcpar.Hierarchy(comm) as h:
        on_cpu = train("cpu", lambda net: DataParallel(net, comm=h, overlap=overlap))
        on_gpu = train(
            "cuda", lambda net: DataParallel(net, comm=h, bucket_mib=0.01, overlap=overlap)
        )
    worst = float((on_cpu - on_gpu).abs().max())
    assert_all(worst < 1e-10, f"GPU training differs from the CPU's by {worst}", comm)
