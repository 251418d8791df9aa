"""Stochastic local search: probSAT, WalkSAT-SKC and configuration checking.

``LocalSearch(cnf, algorithm, seed)`` prepares the compiled search (duplicate literals
dropped, tautologies removed: they are always true), ``run(flips)`` searches for at
most that many flips and says whether every clause is satisfied; ``model()`` is the
assignment (checked independently by ``check_model``). ``state()`` / ``load_state()``
hold everything a continued run needs (assignment, random state, flip count), so a run
restored from a checkpoint continues flip for flip.

probSAT (Balint and Schoening, SAT 2012; parameters of the SAT Competition 2013
version by clause length): pick a false clause at random, flip one of its variables
with probability proportional to ``f(break)``, polynomial ``(eps + break)^-cb`` for
3-SAT (cb 2.06, eps 0.9) and exponential ``cb^-break`` for longer clauses (cb 2.85,
3.7, 5.1, 5.4 for k = 4, 5, 6, >= 7). WalkSAT-SKC (Selman, Kautz, Cohen): a
zero-break variable if the clause has one, else a random one with probability
``noise`` (0.567), else one of least break. ``cc``: focused configuration checking
(Cai and Su's CC strategy applied to the variables of a random false clause, as in
Swcca/FrwCB): among the clause's variables whose neighbourhood changed since they last
flipped, the one of best score ``make - break`` (ties: the least recently flipped);
a random one with probability ``wp`` (0.01).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import kernels as K
from .cnf import CNF, SatError

__all__ = ["ALGORITHMS", "LocalSearch", "probsat_defaults"]

ALGORITHMS = {"probsat": K.ALG_PROBSAT, "walksat": K.ALG_WALKSAT, "cc": K.ALG_CC}


def probsat_defaults(k: int) -> tuple[str, float, float]:
    """(function, cb, eps) of probSAT's SC13 version for clauses of length ``k``."""
    if k <= 3:
        return "poly", 2.06, 0.9
    return "exp", {4: 2.85, 5: 3.7, 6: 5.1}.get(k, 5.4), 0.0


def _prepare(cnf: CNF) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clauses as (0-based variable, sign) arrays: duplicates dropped, tautologies gone."""
    keep_var, keep_sign, starts = [], [], [0]
    widths = np.diff(cnf.starts)
    if widths.size and np.all(widths == widths[0]):  # the common case, vectorised
        k = int(widths[0])
        lits = cnf.lits.reshape(-1, k).astype(np.int64)
        s = np.sort(lits, axis=1)
        dup = np.any(s[:, 1:] == s[:, :-1], axis=1) if k > 1 else np.zeros(len(s), bool)
        a = np.sort(np.abs(lits), axis=1)
        same_var = np.any(a[:, 1:] == a[:, :-1], axis=1) if k > 1 else dup
        if not same_var.any():
            return (
                (np.abs(lits) - 1).astype(np.int32).ravel(),
                (lits > 0).astype(np.uint8).ravel(),
                np.arange(0, lits.size + 1, k, dtype=np.int64),
            )
    for i in range(cnf.n_clauses):
        clause = dict.fromkeys(cnf.clause(i).tolist())  # order kept, duplicates dropped
        if any(-lit in clause for lit in clause):
            continue  # x or not x: always true
        keep_var += [abs(lit) - 1 for lit in clause]
        keep_sign += [lit > 0 for lit in clause]
        starts.append(len(keep_var))
    return (
        np.array(keep_var, dtype=np.int32),
        np.array(keep_sign, dtype=np.uint8),
        np.array(starts, dtype=np.int64),
    )


class LocalSearch:
    """One seeded local-search run on ``cnf`` (see the module docstring).

    Args:
        cnf: The formula.
        algorithm: ``probsat``, ``walksat`` or ``cc``.
        seed: Seed of the random assignment and of every choice.
        cb: probSAT's base (default by clause length), ``eps`` its polynomial offset.
        noise: WalkSAT's noise (0.567); ``wp`` the CC random-walk probability (0.01).
        restart: Flips between restarts from a fresh random assignment (0: never).

    Raises:
        SatError: an unknown algorithm or a parameter out of range.
    """

    def __init__(
        self,
        cnf: CNF,
        algorithm: str = "probsat",
        seed: int = 0,
        *,
        cb: float | None = None,
        eps: float | None = None,
        noise: float = 0.567,
        wp: float = 0.01,
        restart: int = 0,
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise SatError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
        if not 0 <= noise <= 1 or not 0 <= wp <= 1 or restart < 0:
            raise SatError("noise and wp must lie in [0, 1] and restart be >= 0")
        self.cnf, self.algorithm, self.seed, self.restart = cnf, algorithm, seed, restart
        self.cvar, self.csign, self.cstart = _prepare(cnf)
        n, m = cnf.n_vars, self.cstart.size - 1
        lit = 2 * self.cvar.astype(np.int64) + (1 - self.csign)
        clause_of = np.repeat(np.arange(m, dtype=np.int32), np.diff(self.cstart))
        order = np.argsort(lit, kind="stable")
        self.occ = clause_of[order]
        self.ostart = np.zeros(2 * n + 1, dtype=np.int64)
        np.cumsum(np.bincount(lit, minlength=2 * n), out=self.ostart[1:])
        width = int(np.diff(self.cstart).max()) if m else 1
        self.weight = np.empty(width)  # the search's scratch
        fn, default_cb, default_eps = probsat_defaults(width)
        cb = default_cb if cb is None else float(cb)
        eps = default_eps if eps is None else float(eps)
        if cb <= 0 or eps < 0 or (fn == "exp" and cb <= 1):
            raise SatError(f"probSAT needs cb > 0 (> 1 for long clauses) and eps >= 0, not {cb}")
        breaks = np.arange(int(np.diff(self.ostart).max(initial=0)) + 2, dtype=np.float64)
        self.probs = (eps + breaks) ** -cb if fn == "poly" else cb**-breaks
        self.params = np.array([noise if algorithm == "walksat" else wp])
        self.a = np.zeros(n, dtype=np.uint8)
        self.numtrue = np.zeros(m, dtype=np.int32)
        self.critx = np.zeros(m, dtype=np.int32)
        self.brk = np.zeros(n, dtype=np.int32)
        self.make = np.zeros(n, dtype=np.int32)
        self.false = np.zeros(m, dtype=np.int32)
        self.where = np.zeros(m, dtype=np.int32)
        self.nfalse = np.zeros(1, dtype=np.int64)
        self.conf = np.ones(n, dtype=np.uint8)
        self.age = np.zeros(n, dtype=np.int64)
        self.rng = K.seed_state(seed)
        self.flips = 0
        self.since_restart = 0
        self.seconds = 0.0
        K.random_assignment(self.a, self.rng)
        self._init()

    def _init(self) -> None:
        K.init_state(
            self.cvar,
            self.csign,
            self.cstart,
            self.a,
            self.numtrue,
            self.critx,
            self.brk,
            self.make,
            self.false,
            self.where,
            self.nfalse,
        )

    @property
    def solved(self) -> bool:
        """Whether every clause is satisfied."""
        return int(self.nfalse[0]) == 0

    @property
    def n_false(self) -> int:
        """Clauses the current assignment falsifies."""
        return int(self.nfalse[0])

    def run(self, flips: int) -> bool:
        """Search for at most ``flips`` more flips; whether the formula is satisfied."""
        t0 = time.perf_counter()
        left = int(flips)
        while left > 0 and not self.solved:
            chunk = left
            if self.restart:
                chunk = min(chunk, self.restart - self.since_restart)
            if self.algorithm == "probsat":
                done = K.search_probsat(
                    self.probs,
                    self.cvar,
                    self.cstart,
                    self.occ,
                    self.ostart,
                    self.a,
                    self.numtrue,
                    self.critx,
                    self.brk,
                    self.false,
                    self.where,
                    self.nfalse,
                    self.rng,
                    self.weight,
                    chunk,
                )
            else:
                done = K.search(
                    ALGORITHMS[self.algorithm],
                    self.params,
                    self.probs,
                    self.cvar,
                    self.csign,
                    self.cstart,
                    self.occ,
                    self.ostart,
                    self.a,
                    self.numtrue,
                    self.critx,
                    self.brk,
                    self.make,
                    self.false,
                    self.where,
                    self.nfalse,
                    self.conf,
                    self.age,
                    self.rng,
                    self.weight,
                    self.flips,
                    chunk,
                )
            self.flips += done
            self.since_restart += done
            left -= done
            if self.restart and self.since_restart >= self.restart and not self.solved:
                K.random_assignment(self.a, self.rng)
                self.conf[:] = 1
                self._init()
                self.since_restart = 0
        self.seconds += time.perf_counter() - t0
        return self.solved

    def model(self) -> np.ndarray:
        """The current assignment (bools, variable 1 first)."""
        return self.a.astype(bool)

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs to continue this run flip for flip.

        The order of the false-clause list is part of it: clauses are picked by position.
        """
        return {
            "assignment": self.a.copy(),
            "rng": self.rng.copy(),
            "age": self.age.copy(),
            "conf": self.conf.copy(),
            "false": self.false[: self.n_false].copy(),  # its order steers the next picks
            "flips": self.flips,
            "since_restart": self.since_restart,
            "algorithm": self.algorithm,
            "seed": self.seed,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``state()``.

        Raises:
            SatError: the state belongs to another formula or algorithm.
        """
        a = np.asarray(state["assignment"])
        if a.shape != self.a.shape or state["algorithm"] != self.algorithm:
            raise SatError(
                f"checkpoint is for {state['algorithm']} on {a.size} variables, "
                f"not {self.algorithm} on {self.a.size}"
            )
        self.a[:] = a
        self.rng[:] = np.asarray(state["rng"], dtype=np.uint64)
        self.age[:] = state["age"]
        self.conf[:] = state["conf"]
        self.flips, self.since_restart = int(state["flips"]), int(state["since_restart"])
        self._init()
        false = np.asarray(state["false"], dtype=np.int32)
        if false.size != self.n_false or set(false.tolist()) != set(
            self.false[: self.n_false].tolist()
        ):
            raise SatError("checkpoint's false clauses do not match its assignment")
        self.false[: false.size] = false
        self.where[false] = np.arange(false.size, dtype=np.int32)
