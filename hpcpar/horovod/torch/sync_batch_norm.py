"""Horovod's ``SyncBatchNorm``: batch statistics over every rank's batch.

In training, each rank sums its batch's values and squares per channel; one
differentiable allreduce (Horovod's gradient: the sum of the ranks' gradients) gives
the whole batch's mean and variance, so the output, the gradients and the running
statistics are those of ``BatchNorm`` on the concatenated batch. In evaluation (with
running statistics) and at one rank it is ``BatchNorm``. Tensors live on the host here
(Horovod's needs a GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..basics import Sum, size
from .mpi_ops import allreduce

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation whose statistics are those of every rank's batch together.

    Args: as Horovod's and ``torch.nn.BatchNorm*d``: ``num_features`` (channels ``C``
    of an ``(N, C, ...)`` input), ``eps``, ``momentum`` (``None``: a cumulative
    average), ``affine``, ``track_running_stats``.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _factor(self) -> float:
        if self.momentum is not None:
            return float(self.momentum)
        return 1.0 / float(self.num_batches_tracked)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalise ``input`` with the whole batch's statistics (training)."""
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        if (not self.training and self.track_running_stats) or size() == 1:
            use_batch = self.training or not self.track_running_stats
            return F.batch_norm(
                input,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                use_batch,
                self._factor() if use_batch and self.track_running_stats else 0.0,
                self.eps,
            )
        return self._sync_bn(input)

    def _sync_bn(self, input: torch.Tensor) -> torch.Tensor:
        c = input.shape[1]
        dims = [0, *range(2, input.dim())]
        n_local = input.numel() // c
        wide = input.double() if input.dtype != torch.float64 else input
        local = torch.cat(
            [
                wide.sum(dims),
                (wide * wide).sum(dims),
                torch.tensor([float(n_local)], dtype=torch.float64),
            ]
        )
        total = allreduce(local, op=Sum)
        count = total[-1]
        mean = total[:c] / count
        var = total[c : 2 * c] / count - mean * mean
        if self.track_running_stats:
            with torch.no_grad():
                m = self._factor()
                unbiased = var * count / max(float(count) - 1.0, 1.0)
                self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
                self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
        shape = [1, c] + [1] * (input.dim() - 2)
        mean_, invstd = mean.view(shape), torch.rsqrt(var + self.eps).view(shape)
        out = (wide - mean_) * invstd
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)
