"""Hogwild!: lock-free updates of a model shared by the ranks of a node, averaged across nodes.

The ranks of each node (of the ``Hierarchy``, so virtual nodes work on one machine)
share one parameter vector in an MPI shared-memory window. Every rank trains on its
shard of each epoch and subtracts its gradient steps straight from the shared vector,
without locks (Niu, Recht, Re and Wright 2011: on sparse problems updates rarely
collide, and the lost ones do not stop convergence). Softmax regression on CSR input
updates only the weight rows of the features present. At the end of each epoch the node
leaders average their models and every node starts the next epoch from the average.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .data import Dataset, epoch_order, local_shard_order, strided_batches
from .models import Model, SgdError, output_delta
from .train import EpochStats, check_training

__all__ = ["HogwildTrainer"]


class HogwildTrainer:
    """See the module docstring.

    Args:
        model: Its ``params`` are replaced by a view of the node's shared vector.
        data: The dataset.
        hierarchy: A ``Hierarchy`` (its node communicators share memory), or ``None``.
        batch: Rows per step and rank.
        lr: Learning rate (> 0).
        seed: Data-order seed.

    Raises:
        SgdError: bad batch or learning rate.
    """

    def __init__(
        self,
        model: Model,
        data: Dataset,
        hierarchy: Any = None,
        *,
        batch: int = 16,
        lr: float = 0.1,
        seed: int = 0,
    ) -> None:
        check_training(lr, batch, data.y_train.size)
        self.model, self.data, self.batch, self.lr, self.seed = model, data, batch, lr, seed
        self.h = hierarchy
        self.win = None
        self.rank, self.size = 0, 1
        self.comm_seconds = 0.0
        if hierarchy is not None and hierarchy.comm.Get_size() > 1:
            from mpi4py import MPI

            self.rank, self.size = hierarchy.comm.Get_rank(), hierarchy.comm.Get_size()
            if data.shard is not None and data.shard != (self.rank, self.size):
                raise SgdError(f"rank {self.rank} of {self.size} holds shard {data.shard}")
            node = hierarchy.node
            n = model.n_params
            mine = n * 8 if node.Get_rank() == 0 else 0
            self.win = MPI.Win.Allocate_shared(mine, 8, comm=node)
            buf, _ = self.win.Shared_query(0)
            shared = np.ndarray((n,), dtype=np.float64, buffer=buf)
            if node.Get_rank() == 0:
                shared[:] = model.params
            node.Barrier()
            model.params = shared  # the layers are views computed from params at each use

    def _rows(self, epoch: int) -> list[np.ndarray]:
        if self.data.shard is not None:  # this rank's shard, in its own order
            return strided_batches(local_shard_order(self.seed, epoch, self.data), 0, 1, self.batch)
        order = epoch_order(self.seed, epoch, self.data.y_train.size)
        return strided_batches(order, self.rank, self.size, self.batch)

    def _step(self, rows: np.ndarray, grad: np.ndarray) -> float:
        x, y = self.data.x_train[rows], self.data.y_train[rows]
        model = self.model
        if hasattr(x, "tocsr") and len(model.sizes) == 2:  # sparse softmax: touched rows only
            _, probs = model.forward(x)
            loss, probs = output_delta(probs, y, 1.0 / rows.size)
            features = np.unique(x.indices)
            w_slice, b_slice = model.slices[0]
            k = model.sizes[1]
            w = model.params[w_slice].reshape(model.sizes[0], k)
            w[features] -= self.lr * (x[:, features].T @ probs)
            model.params[b_slice] -= self.lr * probs.sum(axis=0)
            return loss
        loss = model.loss_and_grad(x, y, grad, 1.0 / rows.size)
        model.params -= self.lr * grad  # no lock: concurrent updates may interleave
        return loss

    def epoch(self, epoch: int) -> EpochStats:
        """Every rank's share of one epoch, then the nodes' models averaged (collective)."""
        t0 = time.perf_counter()
        grad = np.zeros(self.model.n_params)
        batches = self._rows(epoch)
        loss = sum(self._step(rows, grad) for rows in batches)
        samples = len(batches) * self.batch
        if self.win is not None:
            from mpi4py import MPI

            h = self.h
            t1 = time.perf_counter()
            h.node.Barrier()  # every update of this epoch is in the shared vector
            if h.leaders is not None:
                total = np.empty_like(self.model.params)
                h.leaders.Allreduce(self.model.params, total, op=MPI.SUM)
                self.model.params[:] = total / h.n_nodes
            h.node.Barrier()
            self.comm_seconds = time.perf_counter() - t1
            loss = h.comm.allreduce(loss, op=MPI.SUM)
            samples = h.comm.allreduce(samples, op=MPI.SUM)
        seconds = time.perf_counter() - t0
        return EpochStats(
            epoch,
            loss / max(samples, 1),
            self.model.accuracy(self.data.x_test, self.data.y_test),
            seconds,
            samples / seconds,
            self.comm_seconds,
        )

    def free(self) -> None:
        """Release the shared window (the model keeps a private copy)."""
        if self.win is not None:
            self.model.params = np.array(self.model.params)
            self.win.Free()
            self.win = None
