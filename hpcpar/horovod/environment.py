"""Horovod's environment variables: each one honoured, refused, or reported as inert.

A Horovod script's job script often sets ``HOROVOD_*`` variables. Those that change
behaviour are honoured here as hpcpar's equivalent; those that choose something hpcpar
does not run (Gloo, oneCCL, Adasum's GPU path) are refused at ``init`` with one line;
tuning knobs without an equivalent are named in one warning at ``init``, never ignored
in silence. Variables that only steer Horovod's build (``HOROVOD_WITH_*``,
``HOROVOD_GPU_*``, ...) are read by nobody at run time, here as in Horovod.
"""

from __future__ import annotations

import os
import warnings

__all__ = [
    "HONOURED",
    "INERT",
    "check",
    "fusion_threshold",
    "allreduce_algorithm",
    "flag",
]

HONOURED = {
    "HOROVOD_FUSION_THRESHOLD": "bytes per gradient bucket of `DistributedOptimizer` "
    "(0: one gradient each); unset: the cost model's choice",
    "HOROVOD_AUTOTUNE": "1: the bucket size the cost model chooses from the first backward "
    "pass, even with `HOROVOD_FUSION_THRESHOLD` set",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "1: hpcpar's `two_level` allreduce for every "
    "allreduce; 0: the cost model's choice (as unset)",
    "HOROVOD_TIMELINE": "a file: rank 0 writes a Chrome-trace timeline of every rank's "
    "collectives there at `shutdown` (as `start_timeline`)",
    "HOROVOD_MPI_THREADS_DISABLE": "1: no communication thread; the gradients are reduced "
    "when `step()`/`synchronize()` runs",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "seconds a collective may wait before hpcpar's "
    "watchdog reports it and ends the job (as `HPCPAR_WATCHDOG`)",
    "HOROVOD_CPU_OPERATIONS": "`mpi` (or unset); anything else is refused",
    "HOROVOD_CONTROLLER": "`mpi` (or unset); anything else is refused",
    "HOROVOD_LOG_LEVEL": "accepted (hpcpar logs through `logging`)",
    "HOROVOD_DYNAMIC_PROCESS_SETS": "accepted (`add_process_set` works with or without it)",
}

# tuning knobs of Horovod's background loop and caches: nothing here to tune
INERT = {
    "HOROVOD_CYCLE_TIME": "a bucket goes out as soon as its last gradient is ready; "
    "there is no cycle to wait for",
    "HOROVOD_CACHE_CAPACITY": "calls are matched by order, so there is no response cache",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "hpcpar's watchdog reports a stall only when it "
    "ends the job (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)",
    "HOROVOD_STALL_CHECK_DISABLE": "see HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_TIMELINE_MARK_CYCLES": "there are no cycles to mark",
    "HOROVOD_DISABLE_GROUP_FUSION": "groups are fused by type only",
    "HOROVOD_THREAD_AFFINITY": "the communication thread runs where the rank runs",
    "HOROVOD_AUTOTUNE_LOG": "the bucket choice is printed by `optimizer.bucket_plan`",
}

_BUILD = ("HOROVOD_WITH", "HOROVOD_WITHOUT", "HOROVOD_GPU", "HOROVOD_BUILD", "HOROVOD_NCCL")


def flag(name: str) -> bool:
    """Whether ``name`` is set to a true value (1, true, yes, on)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def check(rank: int) -> None:
    """Refuse what cannot run here (ValueError, one line); warn once about inert knobs."""
    for name in ("HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER"):
        value = os.environ.get(name, "").strip().lower()
        if value not in ("", "mpi"):
            raise ValueError(
                f"{name}={os.environ[name]}: hpcpar.horovod runs over MPI only; unset it "
                "or set it to mpi"
            )
    gloo = sorted(n for n in os.environ if n.startswith("HOROVOD_GLOO_"))
    if gloo:
        raise ValueError(
            f"{gloo[0]} is set: this job was started by horovodrun's Gloo launcher; "
            "hpcpar.horovod runs over MPI: start it with hpcpar horovodrun, hpcpar "
            "launch, mpiexec or srun"
        )
    value = os.environ.get("HOROVOD_FUSION_THRESHOLD", "").strip()
    if value and not (value.isdigit()):
        raise ValueError(
            f"HOROVOD_FUSION_THRESHOLD={value}: expected a number of bytes (e.g. 67108864)"
        )
    seconds = os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "").strip()
    if seconds:
        try:
            if float(seconds) < 0:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={seconds}: expected seconds"
            ) from None
    inert = [
        n
        for n in sorted(os.environ)
        if n.startswith("HOROVOD_") and n not in HONOURED and not n.startswith(_BUILD)
    ]
    if inert and rank == 0:
        unknown = "not a Horovod setting hpcpar knows"
        words = "; ".join(f"{n}: {INERT.get(n, unknown)}" for n in inert)
        warnings.warn(f"hpcpar.horovod: no effect here: {words}", RuntimeWarning, stacklevel=3)


def fusion_threshold() -> int | None:
    """The gradient bucket size in bytes from ``HOROVOD_FUSION_THRESHOLD`` (None: auto)."""
    value = os.environ.get("HOROVOD_FUSION_THRESHOLD", "").strip()
    if not value or flag("HOROVOD_AUTOTUNE"):
        return None
    return int(value)


def allreduce_algorithm() -> str:
    """``two_level`` with ``HOROVOD_HIERARCHICAL_ALLREDUCE=1``, else the cost model's."""
    return "two_level" if flag("HOROVOD_HIERARCHICAL_ALLREDUCE") else "auto"
