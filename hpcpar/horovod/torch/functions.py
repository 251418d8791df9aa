"""Horovod's parameter, optimizer-state and object helpers (Horovod's ``functions``)."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch

from ..basics import ProcessSet, global_process_set, rank
from .mpi_ops import allgather, broadcast_, broadcast_async_, synchronize

__all__ = [
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
]


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Broadcast a ``state_dict()``, ``named_parameters()`` or ``parameters()`` in place."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = [broadcast_async_(p, root_rank, name) for name, p in items]
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer: Any, root_rank: int, model: Any = None) -> None:
    """Give every process ``root_rank``'s optimizer state and hyper-parameters.

    The root's ``state_dict()`` as it is (an optimizer that has not stepped yet has no
    per-parameter state to send; Horovod instead first takes a step with zero gradients
    on every process). ``model`` is accepted for Horovod's signature.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """``root_rank``'s object on every process (pickled by the program, in memory)."""
    if rank() == root_rank:
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        length = torch.tensor([data.size], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, process_set=process_set)
    buf = (
        torch.from_numpy(data.copy())
        if rank() == root_rank
        else torch.empty(int(length), dtype=torch.uint8)
    )
    broadcast_(buf, root_rank, process_set=process_set)
    return obj if rank() == root_rank else pickle.loads(buf.numpy().tobytes())


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Every process's object, in rank order (pickled by the program, in memory)."""
    data = torch.from_numpy(np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy())
    lengths = allgather(torch.tensor([data.numel()], dtype=torch.int64), process_set=process_set)
    gathered = allgather(data, process_set=process_set).numpy()
    edges = np.concatenate([[0], np.cumsum(lengths.numpy())])
    return [pickle.loads(gathered[edges[i] : edges[i + 1]].tobytes()) for i in range(len(lengths))]
