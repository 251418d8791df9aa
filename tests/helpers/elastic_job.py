"""A Horovod elastic training script (``hvd.elastic``), for the resume tests.

``python elastic_job.py OUT STEPS [KILL_AT]``: trains a small float64 model on the
same global batch of 12 rows per step at any rank count (each rank its 12/p rows),
committing after every step; with ``KILL_AT``, the last rank ends its process right
after that step's commit. Rank 0 writes the final parameters to ``OUT`` (JSON).
"""

from __future__ import annotations

import json
import os
import sys

import torch

import hpcpar.horovod.torch as hvd

GLOBAL_ROWS = 12


def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_ROWS, 5, generator=g, dtype=torch.float64)
    return x, x.sum(1, keepdim=True).sin()


def make_model():
    """The job's model, the same on every rank (seeded)."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)]
    return torch.nn.Sequential(*layers).double()


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    hvd.init()
    model = make_model()
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.01), model.named_parameters()
    )
    state = hvd.elastic.TorchState(model, opt, step=0)

    @hvd.elastic.run
    def train(state):
        share = GLOBAL_ROWS // hvd.size()
        rows = slice(hvd.rank() * share, (hvd.rank() + 1) * share)
        while state.step < steps:
            x, y = batch(state.step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
            opt.step()
            state.step += 1
            state.commit()
            if state.step == kill_at and hvd.rank() == hvd.size() - 1:
                os._exit(9)

    train(state)
    if hvd.rank() == 0:
        params = {k: v.tolist() for k, v in model.state_dict().items()}
        with open(out, "w") as f:
            json.dump({"commits": state.commits, "params": params}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main()
