"""The MPI portfolio: independent seeded searches on every rank, first verified model wins.

Each rank searches in chunks of ``check_every`` flips and, between chunks, tests a
receive posted for a stop message (nonblocking), so a rank stops at most
``check_every`` flips after the message reaches it. A rank whose chunk satisfies
every clause verifies the model with ``check_model`` (independent of the search's
counters), sends stop to every other rank and stops. Then all ranks agree on the
winners (more than one may finish in the same chunk); the model of the winner with the
fewest flips (the first to get there; ties to the lower rank) is broadcast, so it is
reported once; every stop message sent is received (no message
is left behind) before the private communicator is freed. A timeout (each rank's own
clock, from a common start) or a flip limit ends the race with no model: UNKNOWN.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cnf import CNF, SatError, check_model
from .solver import ALGORITHMS, LocalSearch

__all__ = ["PortfolioResult", "portfolio", "rank_plan"]

_STOP = 7


@dataclass
class PortfolioResult:
    """The outcome, the same on every rank."""

    model: np.ndarray | None
    winner: int
    algorithm: str
    flips: int  # the winner's flips (or the most of any rank without a model)
    total_flips: int
    seconds: float
    flips_per_s: float
    stop_lag_s: float = 0.0
    per_rank: list[dict[str, Any]] = field(default_factory=list)

    @property
    def satisfiable(self) -> bool:
        """Whether a verified model was found."""
        return self.model is not None


def rank_plan(
    rank: int, algorithms: list[str], seed: int, node: int | None = None
) -> tuple[str, int]:
    """(algorithm, seed) of ``rank``.

    Algorithms go round-robin over ranks, or over nodes when ``node`` is given (the
    hierarchical portfolio: a different algorithm per node, different seeds within it).
    """
    if not algorithms or any(a not in ALGORITHMS for a in algorithms):
        raise SatError(f"algorithms must come from {', '.join(ALGORITHMS)}, not {algorithms}")
    which = rank if node is None else node
    return algorithms[which % len(algorithms)], seed + rank


def _drain(comm: Any, stop: Any, note: np.ndarray, expected: int) -> None:
    """Receive the ``expected`` stop messages addressed to this rank (or cancel)."""
    from mpi4py import MPI

    if stop is None:
        return
    if expected == 0:
        stop.Cancel()
        stop.Wait()
        return
    stop.Wait()
    for _ in range(expected - 1):
        comm.Recv(note, source=MPI.ANY_SOURCE, tag=_STOP)


def portfolio(
    cnf: CNF,
    comm: Any,
    *,
    algorithms: list[str] | None = None,
    seed: int = 0,
    timeout: float | None = None,
    max_flips: int = 0,
    check_every: int = 20000,
    node: int | None = None,
    **options: Any,
) -> PortfolioResult:
    """Race one seeded search per rank of ``comm`` (collective); see the module docstring.

    Raises:
        SatError: bad algorithms or limits.
    """
    from mpi4py import MPI

    if check_every < 1 or max_flips < 0 or (timeout is not None and timeout <= 0):
        raise SatError("check_every must be >= 1, max_flips >= 0 and timeout > 0")
    algorithm, my_seed = rank_plan(comm.Get_rank(), algorithms or ["probsat"], seed, node)
    ls = LocalSearch(cnf, algorithm, my_seed, **options)
    comm = comm.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    note = np.zeros(1, dtype=np.int64)
    stop = comm.Irecv(note, source=MPI.ANY_SOURCE, tag=_STOP) if size > 1 else None
    comm.Barrier()
    t0 = time.time()
    found = stopped = False
    while True:
        chunk = check_every if not max_flips else min(check_every, max_flips - ls.flips)
        if chunk > 0 and ls.run(chunk):
            if check_model(cnf, ls.model()) >= 0:  # never print an unverified model
                raise AssertionError(f"{algorithm}: search reported a false model")
            found = True
            break
        if stop is not None and stop.Test():
            stopped = True
            break
        if (timeout is not None and time.time() - t0 >= timeout) or (
            max_flips and ls.flips >= max_flips
        ):
            break
    t_found = time.time() if found else 0.0
    sends = [
        comm.Isend(np.array([rank], dtype=np.int64), dest=r, tag=_STOP)
        for r in range(size)
        if found and r != rank
    ]
    t_exit = time.time()
    mine = {
        "rank": rank,
        "algorithm": algorithm,
        "seed": my_seed,
        "flips": ls.flips,
        "seconds": ls.seconds,
        "found": found,
        "stopped": stopped,
        "t_found": t_found,
        "t_exit": t_exit,
    }
    everyone = comm.allgather(mine)
    winners = [d["rank"] for d in everyone if d["found"]]
    _drain(comm, stop, note, len(winners) - (1 if found else 0))
    MPI.Request.Waitall(sends)
    model = None
    # several ranks may finish within one chunk: the one with fewest flips got there first
    winner = min(winners, key=lambda r: (everyone[r]["flips"], r)) if winners else -1
    if winner >= 0:
        buf = ls.a.copy() if rank == winner else np.empty(cnf.n_vars, dtype=np.uint8)
        comm.Bcast(buf, root=winner)
        model = buf.astype(bool)
    comm.Free()
    total = sum(d["flips"] for d in everyone)
    seconds = max(d["t_exit"] for d in everyone) - t0
    w = everyone[winner] if winner >= 0 else max(everyone, key=lambda d: d["flips"])
    lag = max(d["t_exit"] for d in everyone) - w["t_found"] if winner >= 0 else 0.0
    busy = sum(d["seconds"] for d in everyone)
    return PortfolioResult(
        model,
        winner,
        w["algorithm"],
        w["flips"],
        total,
        seconds,
        total / busy if busy > 0 else 0.0,
        max(lag, 0.0),
        everyone,
    )
