"""Data-parallel SGD, ``sync`` mode: bucketed, overlapped gradient allreduce.

Each step takes the next ``batch`` rows of the epoch's (seeded) permutation as the
global batch; rank r differentiates its ``batch / size`` rows. The backward pass hands
out each layer's gradient slice as soon as it is final (last layer first); slices are
packed into buckets of ``bucket_bytes`` (25 MiB by default, like DDP) and each full
bucket is reduced with ``hpcpar.iallreduce`` at once, overlapping with the
differentiation of the earlier layers. The update is plain SGD on the averaged
gradient, so training equals one process with the same global batch (up to the order
of the floating-point sums; bit for bit at every rank count with ``reproducible=True``,
which computes fixed chunks of the batch separately and sums them in one fixed tree).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .data import Dataset, batch_rows, local_shard_order, shard_order
from .models import Model, SgdError

__all__ = ["SyncTrainer", "EpochStats", "check_training"]


def check_training(lr: Any, batch: int, rows: int, ranks: int = 1) -> None:
    """Check the learning rate and the batch size against the data and the ranks.

    Raises:
        SgdError: ``lr`` not a positive number, or ``batch`` not a multiple of ``ranks``
            in ``1..rows`` (the training rows).
    """
    if not isinstance(lr, (int, float)) or not lr > 0 or not np.isfinite(lr):
        raise SgdError(f"learning rate must be a positive number, not {lr!r}")
    if batch < 1 or batch % ranks:
        raise SgdError(
            f"batch {batch} must be a positive multiple of the number of ranks ({ranks})"
        )
    if batch > rows:
        raise SgdError(f"batch {batch} is larger than the training set ({rows})")


@dataclass
class EpochStats:
    """One epoch's figures."""

    epoch: int
    loss: float
    test_accuracy: float
    seconds: float
    samples_per_s: float
    comm_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class SyncTrainer:
    """Synchronous data-parallel SGD with bucketed iallreduce.

    Args:
        model: The model (every rank starts from the same seed, so the same parameters).
        data: The dataset (every rank uses only its rows of each global batch).
        comm: ``None`` (one process) or a communicator / ``Hierarchy``.
        batch: The global batch size (divisible by the number of ranks).
        lr: The learning rate (> 0).
        bucket_bytes: Gradient bucket size.
        reproducible: Bitwise the same model at every rank count: the global batch is
            cut into ``chunks`` equal pieces, each piece's gradient is computed alone
            (on whichever rank holds it), all pieces are gathered and summed in one
            fixed pairwise tree. Costs ``chunks`` gradients of communication per step
            and gives up the bucket overlap.
        chunks: Pieces per global batch with ``reproducible`` (default 12: divides
            among 1, 2, 3, 4, 6 and 12 ranks); must divide the batch and be a multiple
            of the ranks.
        seed: The data-order seed.
        shards: With data loaded whole, compose each global batch as ``shards`` shards
            would (the single-process reference of a sharded run); taken from ``data``
            when it holds one shard (``load_dataset(..., shard=(rank, ranks))``).

    Raises:
        SgdError: bad batch size or learning rate.
    """

    def __init__(
        self,
        model: Model,
        data: Dataset,
        comm: Any = None,
        *,
        batch: int = 64,
        lr: float = 0.1,
        bucket_bytes: int = 25 << 20,
        reproducible: bool = False,
        chunks: int = 12,
        seed: int = 0,
        mode: str = "sync",
        local_steps: int = 8,
        shards: int = 0,
    ) -> None:
        self.comm = None
        if comm is not None:
            from hpcpar.runtime.comm import resolve_comm

            resolved = resolve_comm(comm)
            self.comm = comm if resolved.Get_size() > 1 else None
            self.size, self.rank = resolved.Get_size(), resolved.Get_rank()
        else:
            self.size, self.rank = 1, 0
        self.shards = data.shard[1] if data.shard is not None else shards
        if data.shard is not None and (data.shard != (self.rank, self.size)):
            raise SgdError(
                f"rank {self.rank} of {self.size} holds shard {data.shard[0]} of "
                f"{data.shard[1]}: load shard (rank, ranks)"
            )
        if self.shards and self.size > 1 and self.shards != self.size:
            raise SgdError(f"{self.shards} data shards on {self.size} ranks: use one per rank")
        check_training(lr, batch, data.n_total, self.size)
        if self.shards and (
            batch % self.shards or data.n_total // self.shards < batch // self.shards
        ):
            raise SgdError(
                f"batch {batch} must be a multiple of the {self.shards} shards and fit in one"
            )
        if mode not in ("sync", "local"):
            raise SgdError(f"unknown mode {mode!r}; implemented: sync, local")
        if local_steps < 1:
            raise SgdError(f"local steps must be at least 1, not {local_steps}")
        if bucket_bytes < 8:
            raise SgdError(f"bucket size must be at least 8 bytes, not {bucket_bytes}")
        self.model, self.data, self.batch, self.lr = model, data, batch, float(lr)
        self.bucket = max(1, bucket_bytes // 8)
        self.reproducible, self.seed = reproducible, seed
        self.chunks = chunks
        if reproducible and mode == "sync" and (chunks < 1 or batch % chunks or chunks % self.size):
            raise SgdError(
                f"reproducible training cuts the batch into {chunks} chunks: the batch "
                f"({batch}) must be a multiple of it and it a multiple of the ranks ({self.size})"
            )
        self.mode, self.local_steps = mode, local_steps
        self.grad = np.zeros(model.n_params)
        self.reduced = np.zeros(model.n_params)
        self.step = 0
        self.comm_seconds = 0.0

    def _rows(self, epoch: int, index: int) -> np.ndarray:
        if not self.shards:
            return batch_rows(
                self.seed, epoch, self.data.y_train.size, index, self.batch, self.rank, self.size
            )
        mine = self.batch // self.shards
        if self.data.shard is not None:  # this rank's shard: its next rows
            return local_shard_order(self.seed, epoch, self.data)[index * mine :][:mine]
        n = self.data.n_total  # one process composing every shard's next rows
        return np.concatenate(
            [
                shard_order(self.seed, epoch, p, self.shards, n)[index * mine :][:mine]
                for p in range(self.shards)
            ]
        )

    def train_step(self, rows: np.ndarray) -> float:
        """One SGD step on this rank's ``rows`` of the global batch; its summed loss."""
        model, grad = self.model, self.grad
        requests: list[Any] = []
        edge = [model.n_params]  # the bucket being filled is [ready, edge)

        def on_ready(ready: int, _stop: int) -> None:  # grad[ready:] is final
            while self.comm is not None and edge[0] - ready >= self.bucket:
                lo = edge[0] - self.bucket
                requests.append(self._start(lo, edge[0]))
                edge[0] = lo

        x, y = self.data.x_train[rows], self.data.y_train[rows]
        if self.mode == "local":  # local step on this rank's rows; average every H steps
            loss = model.loss_and_grad(x, y, grad, 1.0 / rows.size)
            model.params -= self.lr * grad
            if self.comm is not None and (self.step + 1) % self.local_steps == 0:
                self.average()
            return loss
        if self.reproducible:
            loss = self._exact_step(x, y)
            model.params -= self.lr * self.reduced
            return loss
        loss = model.loss_and_grad(x, y, grad, 1.0 / self.batch, on_ready)
        if self.comm is None:
            model.params -= self.lr * grad
            return loss
        if edge[0] > 0:
            requests.append(self._start(0, edge[0]))
        t0 = time.perf_counter()
        for request in requests:
            request.wait()
        self.comm_seconds += time.perf_counter() - t0
        model.params -= self.lr * self.reduced
        return loss

    def _exact_step(self, x: Any, y: np.ndarray) -> float:
        """Gradient of the global batch into ``reduced``, the same bits at any rank count."""
        per = self.batch // self.chunks
        mine = y.size // per
        parts = np.empty((mine, self.model.n_params))
        loss = 0.0
        for i in range(mine):
            loss += self.model.loss_and_grad(
                x[i * per : (i + 1) * per], y[i * per : (i + 1) * per], parts[i], 1.0 / self.batch
            )
        if self.comm is not None:
            from hpcpar.runtime.comm import resolve_comm

            t0 = time.perf_counter()
            every = np.empty((self.chunks, self.model.n_params))
            resolve_comm(self.comm).Allgather(parts, every)
            self.comm_seconds += time.perf_counter() - t0
            parts = every
        while parts.shape[0] > 1:  # one fixed pairwise tree over the chunk index
            half = parts.shape[0] // 2
            paired = parts[: 2 * half : 2] + parts[1 : 2 * half : 2]
            parts = np.concatenate([paired, parts[2 * half :]]) if parts.shape[0] % 2 else paired
        self.reduced[:] = parts[0]
        return loss

    def average(self) -> None:
        """Replace every rank's parameters by their mean (local SGD's communication)."""
        import hpcpar

        t0 = time.perf_counter()
        hpcpar.allreduce(
            self.model.params, out=self.reduced, comm=self.comm, reproducible=self.reproducible
        )
        self.model.params[:] = self.reduced / self.size
        self.comm_seconds += time.perf_counter() - t0

    def _start(self, lo: int, hi: int) -> Any:
        import hpcpar

        return hpcpar.iallreduce(
            self.grad[lo:hi],
            out=self.reduced[lo:hi],
            comm=self.comm,
            reproducible=self.reproducible,
        )

    @property
    def steps_per_epoch(self) -> int:
        """Global batches per epoch (the last partial batch is dropped)."""
        if self.shards:  # as many as the smallest shard gives
            return (self.data.n_total // self.shards) // (self.batch // self.shards)
        return self.data.y_train.size // self.batch

    def epoch(self, epoch: int, start: int = 0, after_step: Any = None) -> EpochStats:
        """One pass over the training set from batch ``start``.

        ``after_step(epoch, index)`` runs after each step (checkpointing).
        """
        t0 = time.perf_counter()
        self.comm_seconds = 0.0
        steps = self.steps_per_epoch
        loss = 0.0
        for index in range(start, steps):
            loss += self.train_step(self._rows(epoch, index))
            self.step += 1
            if after_step is not None:
                after_step(epoch, index)
        if self.mode == "local" and self.comm is not None and self.step % self.local_steps:
            self.average()  # end every epoch on one model
        steps = max(steps - start, 1)
        seconds = time.perf_counter() - t0
        total = self._sum(loss) / (steps * self.batch)
        return EpochStats(
            epoch,
            total,
            self.model.accuracy(self.data.x_test, self.data.y_test),
            seconds,
            steps * self.batch / seconds,
            self.comm_seconds,
        )

    def _sum(self, value: float) -> float:
        if self.comm is None:
            return value
        from mpi4py import MPI

        from hpcpar.runtime.comm import resolve_comm

        return resolve_comm(self.comm).allreduce(value, op=MPI.SUM)
