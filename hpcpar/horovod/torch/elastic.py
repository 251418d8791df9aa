"""Horovod's elastic API (``hvd.elastic``) on hpcpar's checkpoints.

``TorchState`` keeps the model, the optimizer and any named values; ``commit()``
keeps a copy in memory (``restore()`` goes back to it) and, with
``HPCPAR_ELASTIC_DIR`` set, saves it with hpcpar's ``Checkpointer`` (memory and
node-local levels, atomic and checksummed, everything ``Replicated``). ``run(func)``
starts ``func(state)`` from the newest committed version found there, whatever the
number of ranks that wrote it, after ``sync()`` gave every rank rank 0's state.

An MPI job cannot drop a failed rank and go on in the same processes (mpi4py leaves
MPI's fault tolerance off for MPICH), so where Horovod re-forms its ring inside the
job, here the job ends and is started again, on the same or another number of ranks
(``hpcpar launch`` again, or its restarts): ``run`` then resumes from the last
commit. ``check_host_updates`` has no host changes to report inside a job.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .. import basics
from ..basics import HorovodInternalError
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = [
    "State",
    "ObjectState",
    "TorchState",
    "HostsUpdatedInterrupt",
    "run",
    "ENV",
]

ENV = "HPCPAR_ELASTIC_DIR"


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal that the hosts changed (never raised inside an MPI job)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class State:
    """Horovod's elastic state: ``save``, ``restore``, ``sync``, ``commit``."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self.commits = 0

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions ``on_reset`` calls (after a restart, as in Horovod)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run the reset callbacks."""
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep this state (memory, and ``HPCPAR_ELASTIC_DIR`` if set); check the hosts."""
        self.save()
        self.commits += 1
        folder = os.environ.get(ENV, "").strip()
        if folder:
            _checkpointer(folder).save(self.commits, self._tree()).wait()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Nothing to report: an MPI job's ranks are fixed for its life.

        Horovod raises ``HostsUpdatedInterrupt`` here when its hosts change.
        """

    def save(self) -> None:
        """Keep a copy of the state in memory (a subclass says what)."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the copy ``save`` kept."""
        raise NotImplementedError

    def sync(self) -> None:
        """Give every rank rank 0's state."""
        raise NotImplementedError

    def _tree(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load_tree(self, tree: dict[str, Any]) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Named values (numbers, strings, lists, dicts of them) kept as attributes."""

    def __init__(self, bcast_object: Callable[..., Any] = broadcast_object, **kwargs: Any) -> None:
        self._bcast_object = bcast_object
        self._saved_state = dict(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        super().__init__()

    def save(self) -> None:
        """Copy the named values."""
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        """Go back to the copies ``save`` made."""
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self) -> None:
        """Rank 0's values on every rank."""
        if self._saved_state:
            synced = self._bcast_object(
                {k: getattr(self, k) for k in self._saved_state}, root_rank=0
            )
            for name, value in synced.items():
                setattr(self, name, value)
            self.save()

    def _tree(self) -> dict[str, Any]:
        return {"values": {k: _plain(getattr(self, k)) for k in self._saved_state}}

    def _load_tree(self, tree: dict[str, Any]) -> None:
        for name, value in tree.get("values", {}).items():
            if name in self._saved_state:
                setattr(self, name, value)
        self.save()


class TorchState(ObjectState):
    """A model, an optimizer and named values, kept and restored together."""

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        self.model, self.optimizer = model, optimizer
        super().__init__(**kwargs)
        self._model_copy: Any = None
        self._optimizer_copy: Any = None
        self.save()

    def save(self) -> None:
        """Copy the model's and optimizer's state and the named values."""
        if self.model is not None:
            self._model_copy = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._optimizer_copy = copy.deepcopy(self.optimizer.state_dict())
        super().save()

    def restore(self) -> None:
        """Go back to the last ``save``/``commit``."""
        if self.model is not None and self._model_copy is not None:
            self.model.load_state_dict(self._model_copy)
        if self.optimizer is not None and self._optimizer_copy is not None:
            self.optimizer.load_state_dict(self._optimizer_copy)
        super().restore()

    def sync(self) -> None:
        """Rank 0's model, optimizer state and values on every rank."""
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        super().sync()

    def _tree(self) -> dict[str, Any]:
        from ...checkpoint import Replicated

        tree = super()._tree()
        if self.model is not None:
            tree["model"] = {
                k: Replicated(v.detach().cpu().numpy().copy())
                for k, v in self.model.state_dict().items()
            }
        if self.optimizer is not None:
            saved = self.optimizer.state_dict()
            tree["optimizer"] = {
                "state": {
                    str(i): {
                        k: Replicated(v.detach().cpu().numpy().copy()) if torch.is_tensor(v) else v
                        for k, v in st.items()
                    }
                    for i, st in saved["state"].items()
                },
                "param_groups": saved["param_groups"],
            }
        return tree

    def _load_tree(self, tree: dict[str, Any]) -> None:
        if self.model is not None and "model" in tree:
            self.model.load_state_dict(
                {k: torch.from_numpy(np.array(v)) for k, v in tree["model"].items()}
            )
        if self.optimizer is not None and "optimizer" in tree:
            saved = tree["optimizer"]
            self.optimizer.load_state_dict(
                {
                    "state": {
                        int(i): {
                            k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v
                            for k, v in st.items()
                        }
                        for i, st in saved["state"].items()
                    },
                    "param_groups": saved["param_groups"],
                }
            )
        super()._load_tree(tree)


def _plain(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.detach().cpu().numpy().copy()
    return value


def _restored(value: Any) -> Any:
    """A restored tree with its ``Replicated`` leaves as plain arrays."""
    from ...checkpoint import Replicated

    if isinstance(value, Replicated):
        return np.asarray(value)
    if isinstance(value, dict):
        return {k: _restored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restored(v) for v in value]
    return value


_CHECKPOINTERS: dict[str, Any] = {}


def _checkpointer(folder: str) -> Any:
    from ...checkpoint import Checkpointer

    if folder not in _CHECKPOINTERS:
        _CHECKPOINTERS[folder] = Checkpointer(
            folder, comm=basics.state().comm, levels=["memory", "local"]
        )
    return _CHECKPOINTERS[folder]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's ``@hvd.elastic.run``: ``func(state, ...)`` from the last commit.

    The first call restores the newest version in ``HPCPAR_ELASTIC_DIR`` (if any: a
    job started again after a failure, on any number of ranks), then gives every rank
    rank 0's state. A ``HorovodInternalError`` restores the last commit in memory and
    ends the call with the error (the job is started again to go on).
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        basics.state()
        folder = os.environ.get(ENV, "").strip()
        if folder and not getattr(state, "_resumed", False):
            ck = _checkpointer(folder)
            if ck.versions():
                step, tree = ck.restore()
                state._load_tree(_restored(tree))
                state.commits = int(step)
                state.on_reset()
            state._resumed = True  # type: ignore[attr-defined]
        state.sync()
        try:
            return func(state, *args, **kwargs)
        except HorovodInternalError:
            state.restore()
            raise

    return wrapper
