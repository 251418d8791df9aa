"""Gradient buckets: filled as autograd produces gradients, reduced in order.

``plan_buckets`` replays a recorded backward pass through the cost model to choose the
bucket size; ``reduce_bucket`` sums one bucket over the ranks (on the communication
thread, ``Reducer``, or after the pass).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np
import torch

__all__ = [
    "MIB",
    "CANDIDATES",
    "Bucket",
    "Reducer",
    "as_array",
    "reduce_bucket",
    "group_indices",
    "make_buckets",
    "plan_buckets",
]

MIB = 1 << 20


class Bucket:
    """Some parameters' gradients in one flat tensor, and which of them are in."""

    def __init__(self, params: list[Any]) -> None:
        self.params = params
        sizes = [p.numel() for p in params]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        total = self.offsets[-1]
        # the gradients, then one "used on this rank" count per parameter: after the sum
        # a zero count means no rank used that parameter
        self.flat = torch.zeros(total + len(params), dtype=params[0].dtype, device=params[0].device)
        self.array = as_array(self.flat)
        self.filled = [False] * len(params)
        self.missing = len(params)
        self.done = threading.Event()
        self.error: BaseException | None = None

    def reset(self) -> None:
        """Empty the bucket for the next pass."""
        self.filled = [False] * len(self.params)
        self.missing = len(self.params)
        self.done.clear()
        self.error = None

    def put(self, slot: int, grad: Any) -> None:
        """Copy parameter ``slot``'s gradient in and count it as used on this rank."""
        a, b = self.offsets[slot], self.offsets[slot + 1]
        self.flat[a:b].copy_(grad.reshape(-1))
        self.flat[self.offsets[-1] + slot] = 1.0
        self.filled[slot] = True
        self.missing -= 1

    def zero_missing(self) -> None:
        """Zeros for the parameters this rank did not use in this pass."""
        for slot, filled in enumerate(self.filled):
            if not filled:
                a, b = self.offsets[slot], self.offsets[slot + 1]
                self.flat[a:b].zero_()
                self.flat[self.offsets[-1] + slot] = 0.0
                self.filled[slot] = True
        self.missing = 0


def as_array(tensor: Any) -> Any:
    """The numpy (CPU) or cupy (CUDA) array sharing ``tensor``'s memory."""
    if tensor.is_cuda:
        import cupy

        return cupy.from_dlpack(tensor)
    return tensor.numpy()


class Reducer(threading.Thread):
    """Reduces the buckets handed to it, in the order handed, on its own communicator."""

    def __init__(self, comm: Any, algorithm: str) -> None:
        super().__init__(name="hpcpar-gradients", daemon=True)
        self.comm, self.algorithm = comm, algorithm
        self.work: queue.SimpleQueue[Bucket | None] = queue.SimpleQueue()

    def run(self) -> None:
        """Reduce the buckets handed over until handed None."""
        while (bucket := self.work.get()) is not None:
            reduce_bucket(bucket, self.comm, self.algorithm, sleep=True)


# the communication thread spins on progress calls for _SPIN_S (a small bucket is done by
# then), then sleeps between them, from _FIRST_PAUSE_S doubling up to _LONGEST_PAUSE_S
# (where a 10 Gbit/s link moves about 60 KiB, less than a socket buffer)
_SPIN_S, _FIRST_PAUSE_S, _LONGEST_PAUSE_S = 1e-4, 1e-5, 5e-5


def reduce_bucket(bucket: Bucket, comm: Any, algorithm: str, *, sleep: bool = False) -> None:
    """Sum ``bucket`` over the ranks in place; an error is kept for the waiting rank.

    ``sleep``: start the reduction nonblocking and drive it with progress calls, after
    the first 100 us with short sleeps between them, so that the thread leaves the core
    to the backward pass while the data is on the wire (a blocking call would spin in
    the library's progress loop).
    """
    import hpcpar

    try:
        if bucket.flat.is_cuda:  # the copies into the bucket ran on the current stream
            torch.cuda.current_stream(bucket.flat.device).synchronize()
        if sleep:
            request = hpcpar.iallreduce(
                bucket.array, out=bucket.array, comm=comm, algorithm=algorithm
            )
            pause, spin = _FIRST_PAUSE_S, time.perf_counter() + _SPIN_S
            while not request.test():
                if time.perf_counter() > spin:
                    time.sleep(pause)
                    pause = min(2 * pause, _LONGEST_PAUSE_S)
        else:
            hpcpar.allreduce(bucket.array, out=bucket.array, comm=comm, algorithm=algorithm)
    except BaseException as exc:  # handed to the thread that waits
        bucket.error = exc
    finally:
        bucket.done.set()


def group_indices(kinds: list[Any], nbytes: list[int], limit: int) -> list[list[int]]:
    """Indices (in the order given) cut into buckets: one kind each, about ``limit`` bytes."""
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, (kind, n) in enumerate(zip(kinds, nbytes, strict=True)):
        if current and (kind != kinds[current[0]] or size >= limit):
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        groups.append(current)
    return groups


def make_buckets(params: list[Any], limit: int) -> list[Bucket]:
    """Reverse registration order, one dtype and device per bucket, about ``limit`` bytes."""
    order = list(reversed(params))
    kinds = [(p.dtype, p.device) for p in order]
    groups = group_indices(kinds, [p.numel() * p.element_size() for p in order], limit)
    return [Bucket([order[i] for i in g]) for g in groups]


# bucket limits ``bucket_mib="auto"`` considers: 64 KiB to 256 MiB
CANDIDATES = tuple(1 << k for k in range(16, 29))


def plan_buckets(
    nbytes: list[int],
    ready: list[float],
    end: float,
    cost: Any,
    *,
    overlap: bool,
    kinds: list[Any] | None = None,
) -> tuple[int, float, dict[int, float]]:
    """The bucket limit that ends the backward pass's communication soonest.

    A replay of one backward pass: parameter ``i`` (in the order the pass produces them,
    ``nbytes[i]`` bytes of gradient) is ready ``ready[i]`` seconds into the pass, which
    ends at ``end``; a bucket goes out when its last gradient is ready (at ``end``
    without ``overlap``) and the buckets are reduced one after another, each taking
    ``cost(bytes)`` seconds. Small buckets start early but each pays a call's latency;
    large ones pay it once but start late.

    Returns:
        The limit in bytes, its communication time exposed after the pass, and the
        exposed time of every candidate limit (ties go to the larger bucket).
    """
    kinds = kinds or [0] * len(nbytes)
    exposed: dict[int, float] = {}
    for limit in CANDIDATES:
        clock = 0.0
        for group in group_indices(kinds, nbytes, limit):
            start = max(ready[i] for i in group) if overlap else end
            clock = max(clock, start) + cost(sum(nbytes[i] for i in group))
        exposed[limit] = max(0.0, clock - end)
    best = min(exposed.values())
    chosen = max(limit for limit, t in exposed.items() if t <= best * 1.01 + 1e-9)
    return chosen, exposed[chosen], exposed
