"""PowerSGD: gradients summed as a low-rank approximation, as torch's DDP hook defines it.

Vogels et al.'s algorithm, with the parameters of ``torch.distributed.algorithms.
ddp_comm_hooks.powerSGD_hook.PowerSGDState``: each matrix ``M`` (a tensor of two or
more dimensions viewed as ``shape[0] x rest``) whose rank-``r`` factors are at least
``min_compression_rate`` times smaller than it is sent as two factors: ``P = sum M Q``
(one allreduce for all matrices), ``P`` orthogonalised (Gram-Schmidt, column by column),
``Q = sum M^T P`` (a second allreduce), and the sum approximated by ``P Q^T``; the other
tensors (vectors, small matrices) are summed exactly in one allreduce. ``Q`` is kept
between calls (warm start: one power iteration per step refines it) and starts from the
same seeded random matrix on every rank. With error feedback each rank keeps
``M - P Q^T / ranks`` (its share of what the approximation missed) and adds it to the
next call's matrix, so what the approximation loses is sent later. The first
``start_powerSGD_iter`` calls are exact (the warm-up torch's hook also has).

Unlike ``hpcpar.allreduce(compression=...)`` the factors are summed over all ranks at
once (the factors are already small); on one node nothing is approximated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .collectives.errors import CollectiveError

__all__ = ["PowerSGD"]


def _orthogonalize(p: np.ndarray, eps: float) -> None:
    """Gram-Schmidt on the columns of ``p`` in place (torch's ``_orthogonalize_gram_schmidt``)."""
    for i in range(p.shape[1]):
        col = p[:, i]
        norm = np.linalg.norm(col)
        col /= norm + eps if eps else (norm if norm > 0 else 1.0)
        if i + 1 < p.shape[1]:
            rest = p[:, i + 1 :]
            rest -= np.outer(col, col @ rest)


class PowerSGD:
    """Low-rank sums of a list of gradients over the ranks, with warm start and feedback.

    Args:
        matrix_approximation_rank: The rank ``r`` of the factors.
        comm: The communicator (None: hpcpar's), a communicator or a ``Hierarchy``.
        start_powerSGD_iter: Calls summed exactly before the approximation starts.
        min_compression_rate: A matrix is approximated only when ``n m / ((n + m) r)``
            is at least this.
        use_error_feedback: Keep what the approximation missed and add it next time.
        warm_start: Keep ``Q`` between calls (else a fresh random one each call).
        orthogonalization_epsilon: Added to each norm in Gram-Schmidt (0: none).
        random_seed: The seed of ``Q``'s first values (the same on every rank).

    Raises:
        CollectiveError: a rank below 1, a negative start or epsilon, a rate below 0.
    """

    def __init__(
        self,
        matrix_approximation_rank: int = 1,
        *,
        comm: Any = None,
        start_powerSGD_iter: int = 1_000,
        min_compression_rate: float = 2.0,
        use_error_feedback: bool = True,
        warm_start: bool = True,
        orthogonalization_epsilon: float = 0.0,
        random_seed: int = 0,
    ) -> None:
        rank = matrix_approximation_rank
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
            raise CollectiveError(f"PowerSGD: matrix_approximation_rank must be >= 1, not {rank!r}")
        if not isinstance(start_powerSGD_iter, (int, np.integer)) or start_powerSGD_iter < 0:
            raise CollectiveError(
                f"PowerSGD: start_powerSGD_iter must be >= 0, not {start_powerSGD_iter!r}"
            )
        if not min_compression_rate >= 0 or not orthogonalization_epsilon >= 0:
            raise CollectiveError(
                "PowerSGD: min_compression_rate and orthogonalization_epsilon must be >= 0"
            )
        self.rank = int(rank)
        self.comm = comm
        self.start_iter = int(start_powerSGD_iter)
        self.min_rate = float(min_compression_rate)
        self.error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.eps = float(orthogonalization_epsilon)
        self.seed = int(random_seed)
        self.iter = 0
        self._q: dict[int, np.ndarray] = {}
        self._error: dict[int, np.ndarray] = {}
        self._rng = np.random.default_rng(self.seed)

    def like(self) -> PowerSGD:
        """A fresh state with the same settings (one per gradient bucket)."""
        return PowerSGD(
            self.rank,
            comm=self.comm,
            start_powerSGD_iter=self.start_iter,
            min_compression_rate=self.min_rate,
            use_error_feedback=self.error_feedback,
            warm_start=self.warm_start,
            orthogonalization_epsilon=self.eps,
            random_seed=self.seed,
        )

    def _compressed(self, shape: tuple[int, ...]) -> bool:
        if len(shape) < 2:
            return False
        n, m = shape[0], int(np.prod(shape[1:]))
        r = min(n, m, self.rank)
        return n * m >= self.min_rate * (n + m) * r

    def allreduce(self, tensors: list[np.ndarray]) -> list[np.ndarray]:
        """The ranks' sums of ``tensors``, the large matrices approximated at rank ``r``.

        ``tensors``: float32/float64 arrays, the same shapes on every rank. The inputs
        are not changed; one call per step, with the same list every time.
        """
        import hpcpar
        from hpcpar.collectives.state import state_for

        arrays = [np.asarray(t) for t in tensors]
        for a in arrays:
            if a.dtype not in (np.float32, np.float64):
                raise CollectiveError(f"PowerSGD: float32 or float64 tensors, not {a.dtype}")
        state = state_for(self.comm)
        self.iter += 1
        if self.iter <= self.start_iter or len(state.node_ranks) == 1:
            return self._exact(arrays)
        big = [i for i, a in enumerate(arrays) if self._compressed(a.shape)]
        small = [i for i in range(len(arrays)) if i not in big]
        out: list[np.ndarray | None] = [None] * len(arrays)
        for i, total in zip(small, self._exact([arrays[i] for i in small]), strict=True):
            out[i] = total
        if not big:
            return out  # type: ignore[return-value]
        dtype = np.result_type(*[arrays[i].dtype for i in big])
        mats = []
        for i in big:
            m = arrays[i].reshape(arrays[i].shape[0], -1).astype(dtype, copy=True)
            if self.error_feedback and i in self._error:
                m += self._error[i]
            mats.append(m)
        qs = [self._q_for(i, m) for i, m in zip(big, mats, strict=True)]
        ps = [m @ q for m, q in zip(mats, qs, strict=True)]
        flat = hpcpar.allreduce(np.concatenate([p.reshape(-1) for p in ps]), comm=self.comm)
        at = 0
        for p in ps:
            p[...] = flat[at : at + p.size].reshape(p.shape)
            at += p.size
            _orthogonalize(p, self.eps)
        qs = [m.T @ p for m, p in zip(mats, ps, strict=True)]
        flat = hpcpar.allreduce(np.concatenate([q.reshape(-1) for q in qs]), comm=self.comm)
        at, ranks = 0, state.size
        for i, m, p, q in zip(big, mats, ps, qs, strict=True):
            q[...] = flat[at : at + q.size].reshape(q.shape)
            at += q.size
            approx = p @ q.T
            if self.error_feedback:
                self._error[i] = m - approx / ranks
            if self.warm_start:
                self._q[i] = q.copy()
            out[i] = approx.reshape(arrays[i].shape).astype(arrays[i].dtype, copy=False)
        return out  # type: ignore[return-value]

    def _exact(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        import hpcpar

        if not arrays:
            return []
        dtype = np.result_type(*[a.dtype for a in arrays])
        flat = hpcpar.allreduce(
            np.concatenate([a.reshape(-1).astype(dtype, copy=False) for a in arrays]),
            comm=self.comm,
        )
        out, at = [], 0
        for a in arrays:
            out.append(flat[at : at + a.size].reshape(a.shape).astype(a.dtype, copy=False))
            at += a.size
        return out

    def _q_for(self, index: int, m: np.ndarray) -> np.ndarray:
        r = min(m.shape[0], m.shape[1], self.rank)
        q = self._q.get(index) if self.warm_start else None
        if q is None or q.shape != (m.shape[1], r):
            q = self._rng.standard_normal((m.shape[1], r)).astype(m.dtype)
        return q

    def owed(self, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
        """What error feedback holds for each tensor (zeros where nothing)."""
        return [
            self._error[i].reshape(s) if i in self._error else np.zeros(s)
            for i, s in enumerate(shapes)
        ]
