"""Asynchronous SGD with a parameter-server rank, gradient clipping and a delay-aware step.

Rank 0 holds the model; every other rank loops: take the next batch of its shard,
differentiate at the parameters it last received, send the gradient with the version
it used, receive the current parameters. The server applies gradients in arrival order
(``MPI.ANY_SOURCE``): each is clipped to norm ``clip`` (clipping bounds the damage a
stale gradient can do, which removes the dependence on the maximum delay) and scaled by
``lr / (1 + staleness / workers)``, where staleness is how many updates the server made
since the worker's copy. The number of gradients is fixed in advance, so the run ends
without a termination protocol. With one rank it is plain SGD.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .data import Dataset, epoch_order, strided_batches
from .models import Model, SgdError
from .train import EpochStats, check_training

__all__ = ["AsyncTrainer"]

_GRAD, _HEAD, _PARAMS = 81, 82, 83


class AsyncTrainer:
    """Parameter-server asynchronous SGD (see the module docstring).

    Raises:
        SgdError: bad batch size, learning rate or clipping norm.
    """

    def __init__(
        self,
        model: Model,
        data: Dataset,
        comm: Any = None,
        *,
        batch: int = 64,
        lr: float = 0.1,
        clip: float = 5.0,
        seed: int = 0,
    ) -> None:
        from hpcpar.runtime.comm import resolve_comm

        self.comm = resolve_comm(comm) if comm is not None else None
        self.size = self.comm.Get_size() if self.comm is not None else 1
        self.rank = self.comm.Get_rank() if self.comm is not None else 0
        check_training(lr, batch, data.y_train.size)
        if not clip > 0:
            raise SgdError(f"clipping norm must be positive, not {clip!r}")
        self.model, self.data, self.batch, self.lr, self.clip = model, data, batch, lr, clip
        self.seed = seed
        self.version = 0
        self.staleness: list[int] = []
        self.comm_seconds = 0.0

    @property
    def workers(self) -> int:
        """Ranks that compute gradients (all but the server, or the one rank)."""
        return max(1, self.size - 1)

    def _batches(self, epoch: int, worker: int) -> list[np.ndarray]:
        order = epoch_order(self.seed, epoch, self.data.y_train.size)
        return strided_batches(order, worker, self.workers, self.batch)

    def _apply(self, grad: np.ndarray, stale: int) -> None:
        norm = float(np.linalg.norm(grad))
        if norm > self.clip:
            grad *= self.clip / norm
        self.model.params -= self.lr / (1.0 + stale / self.workers) * grad
        self.version += 1
        self.staleness.append(stale)

    def epoch(self, epoch: int) -> EpochStats:
        """One pass over the training set by all workers (collective)."""
        t0 = time.perf_counter()
        self.comm_seconds = 0.0
        model, n = self.model, self.model.n_params
        grad = np.zeros(n)
        loss = 0.0
        if self.comm is None or self.size == 1:
            for rows in self._batches(epoch, 0):
                loss += model.loss_and_grad(
                    self.data.x_train[rows], self.data.y_train[rows], grad, 1.0 / rows.size
                )
                self._apply(grad, 0)
            samples = len(self._batches(epoch, 0)) * self.batch
        elif self.rank == 0:
            loss, samples = self._serve(epoch, grad)
        else:
            loss, samples = self._work(epoch, grad)
        if self.comm is not None and self.size > 1:
            from mpi4py import MPI

            self.comm.Bcast(model.params, root=0)  # every rank ends on the server's model
            loss = self.comm.allreduce(loss, op=MPI.SUM)
            samples = self.comm.allreduce(samples, op=MPI.SUM)
            self.version = self.comm.bcast(self.version, root=0)
        seconds = time.perf_counter() - t0
        stale = self.staleness or [0]
        return EpochStats(
            epoch,
            loss / max(samples, 1),
            model.accuracy(self.data.x_test, self.data.y_test),
            seconds,
            samples / seconds,
            self.comm_seconds,
            {"mean_staleness": float(np.mean(stale)), "max_staleness": int(np.max(stale))},
        )

    def _serve(self, epoch: int, grad: np.ndarray) -> tuple[float, int]:
        from mpi4py import MPI

        comm = self.comm
        counts = comm.gather(0, root=0)
        total = sum(counts[1:])
        status = MPI.Status()
        head = np.zeros(2)
        for _ in range(total):
            comm.Recv(head, source=MPI.ANY_SOURCE, tag=_HEAD, status=status)
            worker = status.Get_source()
            comm.Recv(grad, source=worker, tag=_GRAD)
            self._apply(grad, self.version - int(head[0]))
            comm.Send(
                np.concatenate([[float(self.version)], self.model.params]), dest=worker, tag=_PARAMS
            )
        return 0.0, 0

    def _work(self, epoch: int, grad: np.ndarray) -> tuple[float, int]:
        comm, model = self.comm, self.model
        batches = self._batches(epoch, self.rank - 1)
        comm.gather(len(batches), root=0)
        reply = np.zeros(model.n_params + 1)
        loss = 0.0
        for rows in batches:
            loss += model.loss_and_grad(
                self.data.x_train[rows], self.data.y_train[rows], grad, 1.0 / rows.size
            )
            t0 = time.perf_counter()
            comm.Send(np.array([float(self.version), loss]), dest=0, tag=_HEAD)
            comm.Send(grad, dest=0, tag=_GRAD)
            comm.Recv(reply, source=0, tag=_PARAMS)
            self.comm_seconds += time.perf_counter() - t0
            self.version = int(reply[0])
            model.params[:] = reply[1:]
        return loss, len(batches) * self.batch
