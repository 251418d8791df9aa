"""The SGD benchmark's torch variants: one network trained through torch DDP or hpcpar.

``TorchRun`` builds the same network as hpcpar's numpy model (same layers, float64,
the same initial weights) and wraps it in torch's ``DistributedDataParallel`` or
hpcpar's ``DataParallel``; ``torch_epoch`` trains it on the same global batches as
hpcpar's sync mode.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from .cli import bucket_bytes

__all__ = ["TorchRun", "state_bytes", "torch_epoch", "torch_accuracy"]


class TorchRun:
    """Torch training of the same network, data-parallel through DDP or hpcpar.

    ``wrap``: ``ddp`` (torch's ``DistributedDataParallel``), ``hpcpar`` (hpcpar's
    ``DataParallel`` as it chooses), ``thread`` (its buckets reduced on a thread during
    the backward pass), ``after`` (after it), ``zero`` (``ZeroOptimizer``: the optimizer
    state sharded over the ranks), ``zero-2l`` (the same with its two-level scatter
    and gather) or ``coded-S`` (``DataParallel`` with compression S; error feedback for
    int8 and 1bit; ``coded-powersgd``: PowerSGD at ``--powersgd-rank``).
    """

    def __init__(
        self, model: Any, data: Any, comm: Any, h: Any, args: argparse.Namespace, wrap: str = "ddp"
    ) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        from .torch import DataParallel

        layers: list[Any] = []
        for i, (w, b) in enumerate(model.layers(model.params)):
            lin = torch.nn.Linear(w.shape[0], w.shape[1]).double()
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w.T.copy()))
                lin.bias.copy_(torch.from_numpy(b.copy()))
            layers.append(lin)
            if i < len(model.sizes) - 2:
                layers.append(torch.nn.Tanh())
        self.net = torch.nn.Sequential(*layers)
        if wrap == "ddp":
            # gradient_as_bucket_view: the gradients live in DDP's buckets (no copy in or
            # out), as PyTorch's DDP documentation recommends for speed and memory
            self.ddp = DistributedDataParallel(
                self.net,
                bucket_cap_mb=bucket_bytes(args.bucket_mib) / 2**20,
                gradient_as_bucket_view=True,
            )
        else:
            overlap = {"hpcpar": None, "thread": True, "after": False}.get(wrap, False)
            scheme = wrap.removeprefix("coded-") if wrap.startswith("coded-") else None
            how: Any = scheme
            if scheme == "powersgd":
                from hpcpar.powersgd import PowerSGD

                how = PowerSGD(args.powersgd_rank, comm=h, start_powerSGD_iter=args.powersgd_start)
            self.ddp = DataParallel(
                self.net,
                comm=h,
                bucket_mib=args.bucket_mib,
                overlap=None if scheme else overlap,
                compression=how,
                error_feedback=scheme in ("int8", "1bit"),
            )
        lr = args.lr / 100 if args.optimizer == "adam" else args.lr
        make = {
            "sgd": lambda p: torch.optim.SGD(p, lr=lr),
            "momentum": lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9),
            "adam": lambda p: torch.optim.Adam(p, lr=lr),
        }[args.optimizer]
        if wrap.startswith("zero"):
            from .torch import ZeroOptimizer

            self.opt = ZeroOptimizer(self.ddp, make, hierarchical=wrap == "zero-2l")
        else:
            self.opt = make(list(self.ddp.parameters()))
        self.torch, self.data, self.comm = torch, data, comm
        self.batch, self.seed = args.batch, args.seed
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        self.x = torch.from_numpy(np.ascontiguousarray(data.x_train))
        self.y = torch.from_numpy(data.y_train.astype(np.int64))


def state_bytes(opt: Any) -> int:
    """Bytes of an optimizer's state tensors (a ``ZeroOptimizer``'s: its slice's)."""
    inner = getattr(opt, "optimizer", opt)
    return sum(
        t.numel() * t.element_size()
        for state in inner.state.values()
        for t in state.values()
        if hasattr(t, "numel") and t.dim() > 0
    )


def torch_epoch(run: TorchRun, e: int) -> tuple[float, float, int]:
    """One epoch of torch DDP on the same global batches as hpcpar's sync mode."""
    from .data import batch_rows

    torch = run.torch
    f = torch.nn.functional
    n = run.data.y_train.size
    mine = run.batch // run.size
    steps = n // run.batch
    loss_sum = 0.0
    t0 = time.perf_counter()
    for index in range(steps):
        rows = torch.from_numpy(
            batch_rows(run.seed, e, n, index, run.batch, run.rank, run.size).copy()
        )  # the rows sync mode takes
        out = run.ddp(run.x[rows])
        loss = f.cross_entropy(out, run.y[rows])  # mean over mine rows; DDP averages ranks
        run.opt.zero_grad(set_to_none=True)
        loss.backward()
        run.opt.step()
        loss_sum += loss.detach().item() * mine
    seconds = time.perf_counter() - t0
    return loss_sum, seconds, steps * run.batch


def torch_accuracy(run: TorchRun) -> float:
    """The trained network's test accuracy."""
    torch = run.torch
    with torch.no_grad():
        out = run.net(torch.from_numpy(np.ascontiguousarray(run.data.x_test)))
        return float((out.argmax(dim=1).numpy() == run.data.y_test).mean())
