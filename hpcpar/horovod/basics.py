"""Horovod's framework-independent basics: init, ranks, build flags, ops, process sets.

Horovod's processes are the ranks of one MPI communicator (``COMM_WORLD`` unless
``init`` is given another, or a list of ranks). ``local_*`` and ``cross_*`` come from
hpcpar's ``Hierarchy`` of that communicator, so virtual layouts (``HPCPAR_LAYOUT``)
give virtual nodes: the local ranks are a node's ranks, the cross ranks those with the
same local rank on every node (Horovod's cross communicator, hpcpar's rail).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from mpi4py import MPI

from ..topology import Hierarchy
from . import environment, timeline

__all__ = [
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "HorovodInternalError",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "init",
    "shutdown",
    "is_initialized",
    "start_timeline",
    "stop_timeline",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "cross_size",
    "cross_rank",
    "is_homogeneous",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "state",
]

# Horovod's reduction op values (horovod/common/message.h)
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


class HorovodInternalError(RuntimeError):
    """A collective failed (Horovod's name: elastic training treats it as recoverable)."""


class ProcessSet:
    """A subset of Horovod's processes that collectives can be limited to.

    ``ProcessSet([0, 2])`` names ranks of Horovod's communicator; it takes effect
    when given to ``init(process_sets=...)`` or ``add_process_set``, which every
    process calls. ``ranks``, ``size()``, ``rank()`` and ``included()`` as in Horovod.
    """

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        self.process_set_id: int | None = None
        self.mpi_comm: Any = None
        self.hierarchy: Hierarchy | None = None  # set_comm's answer, kept while registered
        if isinstance(ranks_or_comm, MPI.Comm):
            self.mpi_comm = ranks_or_comm
            self.ranks: list[int] | None = None
        else:
            self.ranks = sorted(int(r) for r in ranks_or_comm)

    def _invalid(self) -> bool:
        return self.process_set_id is None

    def size(self) -> int | None:
        """The number of processes in the set (None before it is registered)."""
        return None if self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank in the set (None if not in it or not registered)."""
        if self.ranks is None or not self.included():
            return None
        return self.ranks.index(rank())

    def included(self) -> bool | None:
        """Whether this process belongs to the set (None before it is registered)."""
        if self._invalid() or self.ranks is None:
            return None
        return rank() in self.ranks

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ProcessSet)
            and self.ranks == other.ranks
            and self.process_set_id == other.process_set_id
        )

    def __hash__(self) -> int:
        return hash((tuple(self.ranks or ()), self.process_set_id))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


class _State:
    """What ``init`` set up: the communicator, its hierarchy, the process sets."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.hierarchy = Hierarchy(comm)
        self.control = comm.Dup()  # join's control rounds (hpcpar.horovod.torch.join)
        self.optimizers: list[Any] = []  # weak references, in creation order
        self.rounds = 0
        self.sets: dict[int, tuple[ProcessSet, Hierarchy | None]] = {}
        self.next_id = 1


_STATE: _State | None = None


def state() -> _State:
    """The state ``init`` made; ValueError (Horovod's) before it."""
    if _STATE is None:
        raise ValueError(_NOT_INITIALIZED)
    return _STATE


def init(
    comm: Sequence[int] | Any | None = None, process_sets: Sequence[ProcessSet] | None = None
) -> None:
    """Start Horovod: on ``COMM_WORLD``, an mpi4py communicator, or a list of its ranks.

    Every process calls it (with a list of ranks, the listed ones). ``process_sets``:
    sets to register at once, as ``add_process_set`` does. A second call does nothing.
    """
    global _STATE
    if _STATE is not None:
        return
    environment.check(MPI.COMM_WORLD.Get_rank())
    if comm is None:
        base = MPI.COMM_WORLD.Dup()
    elif isinstance(comm, MPI.Comm):
        base = comm.Dup()
    elif isinstance(comm, Sequence) and all(isinstance(r, int) for r in comm):
        world = MPI.COMM_WORLD
        group = world.Get_group().Incl(sorted(comm))
        base = world.Create_group(group)
        group.Free()
    else:
        raise ValueError(
            "Invalid type of argument comm. Expected list of rank integers or "
            "mpi4py.MPI.Comm object."
        )
    _STATE = _State(base)
    global_process_set.ranks = list(range(base.Get_size()))
    global_process_set.mpi_comm = base
    _STATE.sets[0] = (global_process_set, _STATE.hierarchy)
    for number, process_set in enumerate(process_sets or ()):
        if any(process_set == known for known, _ in _STATE.sets.values()):
            raise ValueError(
                f"Horovod could not be initialized because process_sets entry number "
                f"{number} is a duplicate: {process_set}"
            )
        add_process_set(process_set)
    _stall_watchdog()
    timeline.start_from_env()


def _stall_watchdog() -> None:
    """``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` as hpcpar's watchdog (unless one runs)."""
    from ..runtime import watchdog

    seconds = os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "").strip()
    if not seconds or float(seconds) == 0 or os.environ.get("HPCPAR_WATCHDOG"):
        return
    os.environ["HPCPAR_WATCHDOG"] = seconds
    watchdog.start_from_env(state().comm)


def shutdown() -> None:
    """Stop Horovod: write the timeline if one runs, free its communicators."""
    global _STATE
    if _STATE is None:
        return
    timeline.stop(_STATE.comm)
    for number, (process_set, sub) in list(_STATE.sets.items()):
        process_set.hierarchy = None
        if number != 0:
            process_set.process_set_id = None
            if sub is not None:
                sub.free()
                sub.comm.Free()
    _STATE.hierarchy.free()
    _STATE.control.Free()
    _STATE.comm.Free()
    global_process_set.ranks, global_process_set.mpi_comm = [], None
    _STATE = None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record every rank's collectives from now on; rank 0 writes ``file_path`` at stop.

    ``mark_cycles`` is accepted for Horovod's signature (there are no cycles here).
    """
    state()
    timeline.start(file_path)


def stop_timeline() -> None:
    """Write the timeline started by ``start_timeline`` (collective; rank 0 writes)."""
    timeline.stop(state().comm)


def is_initialized() -> bool:
    """Whether ``init`` was called (and not ``shutdown`` since)."""
    return _STATE is not None


def size() -> int:
    """The number of Horovod processes."""
    return int(state().comm.Get_size())


def rank() -> int:
    """This process's Horovod rank."""
    return int(state().comm.Get_rank())


def local_size() -> int:
    """The number of processes on this process's node (virtual node under a layout)."""
    return int(state().hierarchy.node.Get_size())


def local_rank() -> int:
    """This process's rank on its node."""
    return int(state().hierarchy.local_rank)


def cross_size() -> int:
    """The number of nodes that have a process of this local rank."""
    return int(state().hierarchy.rail.Get_size())


def cross_rank() -> int:
    """This process's rank among the processes of its local rank (its node's index)."""
    return int(state().hierarchy.rail.Get_rank())


def is_homogeneous() -> bool:
    """Whether every node has the same number of processes."""
    node_of = state().hierarchy.node_of
    counts = [node_of.count(n) for n in set(node_of)]
    return len(set(counts)) == 1


def mpi_threads_supported() -> bool:
    """Whether MPI runs at ``MPI_THREAD_MULTIPLE``."""
    state()
    return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)


def mpi_enabled() -> bool:
    """True: hpcpar's collectives run over MPI."""
    return True


def mpi_built() -> bool:
    """True: hpcpar's collectives run over MPI."""
    return True


def gloo_enabled() -> bool:
    """False: there is no Gloo controller."""
    return False


def gloo_built() -> bool:
    """False: there is no Gloo controller."""
    return False


def nccl_built() -> int:
    """0: no NCCL operations (Horovod returns the NCCL version it was built with)."""
    return 0


def ddl_built() -> bool:
    """False."""
    return False


def ccl_built() -> bool:
    """False."""
    return False


def cuda_built() -> bool:
    """False: tensors are reduced on the host."""
    return False


def rocm_built() -> bool:
    """False."""
    return False


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set; every Horovod process calls it, in the same order.

    Returns the registered set (a new ``ProcessSet`` when given a list of ranks).
    """
    st = state()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.mpi_comm is not None and process_set.ranks is None:
        group, world = process_set.mpi_comm.Get_group(), st.comm.Get_group()
        process_set.ranks = sorted(
            int(r) for r in group.Translate_ranks(list(range(group.Get_size())), world)
        )
        group.Free()
        world.Free()
    ranks = process_set.ranks or []
    if (
        not ranks
        or ranks[0] < 0
        or ranks[-1] >= st.comm.Get_size()
        or len(set(ranks)) != len(ranks)
    ):
        raise ValueError(
            f"a process set needs distinct ranks in 0..{st.comm.Get_size() - 1}: {ranks}"
        )
    if any(known.ranks == ranks for known, _ in st.sets.values()):
        raise ValueError(f"Horovod already has a process set with ranks {ranks}")
    member = st.comm.Get_rank() in ranks
    # collective over every Horovod process; each member keeps its node (virtual layouts)
    sub = st.hierarchy.split(1 if member else 0, st.comm.Get_rank())
    if not member:
        sub.free()
        sub.comm.Free()
        sub = None
    process_set.process_set_id = st.next_id
    st.next_id += 1
    st.sets[process_set.process_set_id] = (process_set, sub)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set; every Horovod process calls it. False if unknown."""
    st = state()
    if process_set.process_set_id in (None, 0) or process_set.process_set_id not in st.sets:
        return False
    known, sub = st.sets.pop(process_set.process_set_id)
    known.hierarchy = process_set.hierarchy = None
    if sub is not None:
        sub.free()
        sub.comm.Free()
    process_set.process_set_id = None
    return True


def set_comm(process_set: ProcessSet) -> Hierarchy:
    """The hierarchy of a registered set this process belongs to (ValueError else).

    hpcpar's collectives take it as their ``comm``: the set's ranks on their nodes.
    """
    st = state()
    found = (
        st.sets.get(process_set.process_set_id) if process_set.process_set_id is not None else None
    )
    if found is None:
        raise ValueError(f"process set {process_set} is not registered (hvd.add_process_set)")
    if found[1] is None:
        raise ValueError(
            f"rank {rank()} is not in process set {process_set.ranks}: only its ranks may call this"
        )
    if found[0] is process_set:
        process_set.hierarchy = found[1]
    return found[1]
