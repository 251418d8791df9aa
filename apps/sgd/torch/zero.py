"""ZeRO stage 1 over a ``DataParallel`` model: each rank keeps one slice of the optimizer state."""

from __future__ import annotations

from typing import Any

import torch

from hpcpar.gradients import as_array

from ..models import SgdError
from .data_parallel import DataParallel

__all__ = ["ZeroOptimizer"]


class ZeroOptimizer:
    """ZeRO stage 1 over a ``DataParallel`` model: optimizer state sharded over ranks.

    Each rank keeps the optimizer state of one slice of the parameters. ``step()``
    reduce-scatters the gradients (each rank receives the sum of its slice), steps its
    slice with its own optimizer, and allgathers the updated slices, so every rank ends
    with the whole model while holding a ``1/ranks`` share of the optimizer state
    (Adam's two moments, momentum buffers). The model's ``backward()`` then leaves the
    gradients as each rank computed them (no allreduce). For element-wise optimizers
    (SGD, momentum, Adam, AdamW) the model is the unsharded one's, within
    floating-point summation order.

    With ``hierarchical=True`` (the ZeRO++ hpZ idea, over a ``Hierarchy``'s nodes) the
    scatter and gather run hpcpar's two-level algorithms: within each node first, and
    only one rank per node talks to the other nodes, so the parameter allgather crosses
    the network once per node instead of once per rank.

    Args:
        model: The ``DataParallel`` model (all parameters of one dtype and device).
        make_optimizer: Builds the inner optimizer from a list of parameters, e.g.
            ``lambda p: torch.optim.Adam(p, lr=1e-3)``.
        hierarchical: Two-level scatter and gather (where the hierarchy has several
            nodes and a node with several ranks; otherwise the flat ones, which are
            then as good).

    Raises:
        SgdError: parameters of several dtypes or devices.
    """

    def __init__(
        self, model: DataParallel, make_optimizer: Any, *, hierarchical: bool = False
    ) -> None:
        self.model = model
        self.params = [p for p in model.module.parameters() if p.requires_grad]
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) != 1:
            raise SgdError("ZeroOptimizer: the parameters must share one dtype and device")
        model.sync_gradients = False  # backward leaves the local gradients to step()
        self.sizes = [p.numel() for p in self.params]
        total = sum(self.sizes)
        size, rank = model.size, model.rank
        self.counts = [total // size + (1 if r < total % size else 0) for r in range(size)]
        self.lo = sum(self.counts[:rank])
        self.hi = self.lo + self.counts[rank]
        nodes = model.hierarchy.node_of
        # two levels only where there are both: several nodes, and a node with several ranks
        two = hierarchical and 1 < len(set(nodes)) < len(nodes)
        self.algorithm = "two_level" if two else model.algorithm
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = torch.nn.Parameter(flat[self.lo : self.hi].clone())
        self.optimizer = make_optimizer([self.shard])

    @property
    def param_groups(self) -> Any:
        """The inner optimizer's parameter groups (learning rate and so on)."""
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        """Reduce-scatter the gradients, step this rank's slice, allgather the model."""
        import hpcpar

        model = self.model
        with torch.no_grad():
            grads = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in self.params
                ]
            )
            mine = hpcpar.reduce_scatter(
                as_array(grads),
                counts=self.counts,
                comm=model.hierarchy,
                algorithm=self._algorithm("reduce_scatter"),
            )
            self.shard.grad = torch.as_tensor(mine, device=grads.device).div_(model.size)
        self.optimizer.step()
        with torch.no_grad():
            whole = hpcpar.allgather(
                as_array(self.shard.detach()),
                counts=self.counts,
                comm=model.hierarchy,
                algorithm=self._algorithm("allgather"),
            )
            flat = torch.as_tensor(whole, device=self.shard.device)
            at = 0
            for p, n in zip(self.params, self.sizes, strict=True):
                p.copy_(flat[at : at + n].view_as(p))
                at += n

    def _algorithm(self, collective: str) -> str:
        """The model's algorithm where ``collective`` has it (allreduce's may not)."""
        from hpcpar.collectives import algorithms_for

        return self.algorithm if self.algorithm in algorithms_for(collective) else "auto"

    def state_dict(self) -> Any:
        """This rank's slice of the optimizer state."""
        return self.optimizer.state_dict()
