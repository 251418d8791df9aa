"""Vectorised, MPI-parallel CFR on a sequence-form tree.

One iteration per player is a few array passes over that player's sequence tree:

1. realisation plan ``x`` of the current strategy (one gather-multiply per own depth);
2. counterfactual values of the last actions, ``g = A y`` (player 0) or ``-A^T x``
   (player 1): one sparse product over the terminals, built once;
3. backwards per own depth: infoset values ``V(I) = sum_a sigma(I,a) q(I,a)`` and
   ``q(parent) += V(I)``; instantaneous regrets ``q(I,a) - V(I)``;
4. the variant's regret and average-strategy updates, then regret matching.

This is exactly CFR as OpenSpiel's tree walk computes it (alternating updates, the
second player seeing the first one's new strategy), in a handful of vectorised calls.

Ranks split each player's sequence forest by its root infosets (whole subtrees, balanced
by size). A rank computes its own part of every pass; after each forward pass the
realisation plans are gathered (``hpcpar.allgather``), the only communication. Every
array op is the same on numpy and cupy (``xp``), sparse products through scipy or cupyx.

Gathered plans and checkpoints use one *canonical* sequence order that does not depend
on the rank count: root subtree, then own depth, then the tree's order. Every rank's
part is one block of it (subtrees go to ranks in order), so a checkpoint's arrays are
``Sharded`` blocks of global arrays and restore on any number of ranks, and every sum
runs in the same order at any rank count: the results on the CPU are bitwise the same
on 1, 2, 3 or more ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .games import CfrError
from .tree import PlayerSeqs, Tree

__all__ = ["ALGORITHMS", "Solver"]

ALGORITHMS = ("cfr", "cfr+", "lcfr", "dcfr", "pcfr+")


@dataclass
class _Layer:
    seqs: slice  # local sequence positions of this own depth
    infosets: slice  # local infoset positions of this own depth
    pad: Any  # (infosets, max actions) local sequence positions, padding -> pad slot
    parents: Any  # per infoset, the local position of its parent sequence


class _Part:
    """One player's sequences owned by this rank, in local coordinates.

    Local arrays have ``L + 2`` slots: the ``L`` owned sequences, a padding slot ``L``
    (0), and slot ``L + 1`` for the empty sequence (reach 1; it collects root values).
    """

    def __init__(self, seqs: PlayerSeqs, owned: np.ndarray, canon: np.ndarray, xp: Any) -> None:
        # owned: this rank's infosets (original numbers), in (depth, original) order;
        # canon: the canonical number of every sequence (the empty one 0)
        n_act = seqs.n_actions[owned]
        self.n_inf = owned.size
        self.L = int(n_act.sum())
        pad, empty = self.L, self.L + 1
        first_local = np.concatenate([[0], np.cumsum(n_act)[:-1]]).astype(np.int64)
        old_seqs = _sequences(seqs, owned)
        local_of_old = {int(s): j for j, s in enumerate(old_seqs)}
        self.old_seqs = old_seqs  # original sequence numbers, local order
        # this rank's block of the canonical order: where it starts, and the permutations
        # between it and the local order (canonical = local[to_canon], local = canonical[
        # from_canon])
        position = canon[old_seqs] - 1
        self.offset = int(position.min()) if self.L else 0
        self.from_canon = position - self.offset
        self.to_canon = np.argsort(self.from_canon)
        if self.L and int(position.max()) - self.offset + 1 != self.L:
            raise CfrError("internal: a rank's sequences are not one block of the canonical order")
        self.to_canon_xp = xp.asarray(self.to_canon)
        inf_of = np.repeat(np.arange(self.n_inf), n_act)
        parent_local = np.array(
            [empty if seqs.parent[i] == 0 else local_of_old[int(seqs.parent[i])] for i in owned],
            dtype=np.int64,
        )
        depth = seqs.depth[owned]
        self.layers: list[_Layer] = []
        width = int(n_act.max()) if self.n_inf else 1
        for d in np.unique(depth):
            ii = np.flatnonzero(depth == d)
            a, b = int(ii[0]), int(ii[-1]) + 1
            c, e = int(first_local[a]), int(first_local[b - 1] + n_act[b - 1])
            w = int(n_act[a:b].max())
            grid = np.full((b - a, w), pad, dtype=np.int64)
            for k in range(w):
                has = n_act[a:b] > k
                grid[has, k] = first_local[a:b][has] + k
            self.layers.append(
                _Layer(slice(c, e), slice(a, b), xp.asarray(grid), xp.asarray(parent_local[a:b]))
            )
        grid = np.full((self.n_inf, width), pad, dtype=np.int64)
        for k in range(width):
            has = n_act > k
            grid[has, k] = first_local[has] + k
        self.grid = xp.asarray(grid)
        self.inf_of = xp.asarray(inf_of)
        self.seq_parent = xp.asarray(parent_local[inf_of] if self.L else np.zeros(0, np.int64))
        self.uniform = xp.asarray(1.0 / n_act[inf_of]) if self.L else xp.zeros(0)


class Solver:
    """CFR and its variants on a compiled tree, on one rank or many.

    Args:
        tree: The game (``tree.build_tree`` / ``tree.load_tree``).
        algorithm: ``cfr``, ``cfr+``, ``lcfr``, ``dcfr`` or ``pcfr+``.
        alternating: Alternating updates (OpenSpiel's default); ``False`` for
            simultaneous ones (vanilla CFR only).
        alpha, beta, gamma: DCFR's discounts (default 1.5, 0, 2).
        comm: ``None`` (one rank, no MPI), a communicator or a ``Hierarchy``.
        device: ``cpu`` (numpy) or ``gpu`` (cupy).

    Raises:
        CfrError: an unknown algorithm or device, or bad parameters.
    """

    def __init__(
        self,
        tree: Tree,
        algorithm: str = "cfr",
        *,
        alternating: bool = True,
        alpha: float = 1.5,
        beta: float = 0.0,
        gamma: float = 2.0,
        comm: Any = None,
        device: str = "cpu",
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise CfrError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
        if not alternating and algorithm != "cfr":
            raise CfrError("simultaneous updates are offered for plain cfr only")
        for label, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise CfrError(f"dcfr {label} must be a finite number, not {value!r}")
        self.tree, self.algorithm, self.alternating = tree, algorithm, alternating
        self.alpha, self.beta, self.gamma = float(alpha), float(beta), float(gamma)
        self.xp, self.sparse = _backend(device)
        self.comm = None
        if comm is not None:
            from hpcpar.runtime.comm import resolve_comm

            resolved = resolve_comm(comm)
            self.comm = resolved if resolved.Get_size() > 1 else None  # one rank: no MPI calls
        self.rank = self.comm.Get_rank() if self.comm is not None else 0
        self.size = self.comm.Get_size() if self.comm is not None else 1
        self._setup()
        self.t = 0

    # ---- layout --------------------------------------------------------------------

    def _setup(self) -> None:
        xp, tree = self.xp, self.tree
        self.parts: list[_Part] = []
        self.canon: list[np.ndarray] = []
        self.counts: list[list[int]] = []
        for seqs in tree.players:
            root = _roots(seqs)
            owner = _partition(seqs, root, self.size)
            infosets = np.arange(seqs.n_infosets)
            canonical = np.lexsort((infosets, seqs.depth, root))
            canon = np.zeros(seqs.n_seq, dtype=np.int64)
            canon[_sequences(seqs, canonical)] = np.arange(1, seqs.n_seq)
            self.canon.append(canon)
            self.counts.append([int(seqs.n_actions[owner == r].sum()) for r in range(self.size)])
            local = np.lexsort((infosets, seqs.depth))  # own depth, then the tree's order
            self.parts.append(_Part(seqs, local[owner[local] == self.rank], canon, xp))
        n0, n1 = tree.players[0].n_seq, tree.players[1].n_seq
        self.mats, self.empty_rows = [], []
        pairs = ((tree.rows, tree.cols, 1.0), (tree.cols, tree.rows, -1.0))
        for p, (r, c, sign) in enumerate(pairs):
            part = self.parts[p]
            local_of = np.full((n0, n1)[p], -1, dtype=np.int64)
            local_of[part.old_seqs] = np.arange(part.L)
            keep = local_of[r] >= 0
            cols = self.canon[1 - p][c]  # the other player's gathered plan is canonical
            shape = (part.L, (n1, n0)[p])
            rows = local_of[r[keep]]
            self.mats.append(_csr(self.sparse, xp, sign * tree.vals[keep], rows, cols[keep], shape))
            top = r == 0
            self.empty_rows.append(
                _csr(self.sparse, xp, sign * tree.vals[top], r[top], cols[top], (1, shape[1]))
                if self.rank == 0
                else None
            )
        self.regret = [xp.zeros(part.L) for part in self.parts]
        self.strategy_sum = [xp.zeros(part.L) for part in self.parts]
        self.last_regret = [xp.zeros(part.L) for part in self.parts]
        self.sigma = [self._match(p, self.regret[p]) for p in (0, 1)]

    # ---- the passes ----------------------------------------------------------------

    def _normalise(self, p: int, weights: Any) -> Any:
        """Non-negative weights normalised per infoset; uniform where an infoset's sum is 0."""
        xp, part = self.xp, self.parts[p]
        if part.L == 0:
            return xp.zeros(0)
        padded = xp.concatenate([weights, xp.zeros(2)])
        sums = padded[part.grid].sum(axis=1)[part.inf_of]
        return xp.where(sums > 0, weights / xp.where(sums > 0, sums, 1.0), part.uniform)

    def _match(self, p: int, regret: Any) -> Any:
        """Regret matching: positive regrets normalised per infoset, else uniform."""
        return self._normalise(p, self.xp.maximum(regret, 0.0))

    def _plan(self, p: int, sigma: Any) -> Any:
        """This rank's part of player p's realisation plan (length L + 2)."""
        xp, part = self.xp, self.parts[p]
        x = xp.zeros(part.L + 2)
        x[part.L + 1] = 1.0
        for layer in part.layers:
            s = layer.seqs
            x[s] = x[part.seq_parent[s]] * sigma[s]
        return x

    def _gather(self, p: int, x: Any) -> Any:
        """Player p's whole realisation plan, in canonical sequence order (empty first)."""
        xp, part = self.xp, self.parts[p]
        local = x[: part.L][part.to_canon_xp]
        if self.comm is None:
            return xp.concatenate([xp.ones(1), local])
        import hpcpar

        host = np.ascontiguousarray(_host(local))
        full = hpcpar.allgather(host, counts=self.counts[p], comm=self.comm)
        return xp.asarray(np.concatenate([[1.0], full]))

    def _values(self, p: int, other_plan: Any, sigma: Any, best: bool = False) -> tuple[Any, Any]:
        """Backward pass: q per local sequence (L + 2 slots) and V per local infoset.

        With ``best`` the infoset value is the best action's (a best response).
        """
        xp, part = self.xp, self.parts[p]
        q = xp.zeros(part.L + 2)
        if part.L:
            q[: part.L] = self.mats[p] @ other_plan
        if self.empty_rows[p] is not None:
            q[part.L + 1] = (self.empty_rows[p] @ other_plan)[0]
        values = xp.zeros(part.n_inf)
        sigma_pad = xp.concatenate([sigma, xp.zeros(2)])
        for layer in reversed(part.layers):
            if best:
                grid = q[layer.pad]
                v = xp.where(layer.pad == part.L, -xp.inf, grid).max(axis=1)
            else:
                v = (sigma_pad[layer.pad] * q[layer.pad]).sum(axis=1)
            values[layer.infosets] = v
            q += xp.bincount(layer.parents, weights=v, minlength=part.L + 2)
        return q, values

    def _update(self, p: int, other_plan: Any) -> None:
        """Regrets and average strategy of player p for iteration ``self.t``."""
        xp, part, t = self.xp, self.parts[p], self.t
        sigma = self.sigma[p]
        x = self._plan(p, sigma)
        q, values = self._values(p, other_plan, sigma)
        inst = q[: part.L] - values[part.inf_of] if part.L else xp.zeros(0)
        reach = x[: part.L]
        alg = self.algorithm
        if alg == "cfr":
            self.regret[p] += inst
            self.strategy_sum[p] += reach
        elif alg == "cfr+":
            self.regret[p] = xp.maximum(self.regret[p] + inst, 0.0)
            self.strategy_sum[p] += t * reach
        elif alg in ("lcfr", "dcfr"):
            a, b, g = (1.0, 1.0, 1.0) if alg == "lcfr" else (self.alpha, self.beta, self.gamma)
            self.strategy_sum[p] += reach * (t**g)
            r = self.regret[p] + inst
            up, down = t**a / (t**a + 1), t**b / (t**b + 1)
            self.regret[p] = xp.where(r >= 0, r * up, r * down)
        else:  # pcfr+: regret matching+ on regrets plus the prediction (the last regret)
            self.strategy_sum[p] += (t * t) * reach
            self.regret[p] = xp.maximum(self.regret[p] + inst, 0.0)
            self.last_regret[p] = inst
        target = self.regret[p] + self.last_regret[p] if alg == "pcfr+" else self.regret[p]
        self.sigma[p] = self._match(p, target)

    def iterate(self, n: int = 1) -> None:
        """Run ``n`` iterations (collective when running on several ranks)."""
        for _ in range(n):
            self.t += 1
            if self.alternating:
                for p in (0, 1):
                    other = 1 - p
                    self._update(p, self._gather(other, self._plan(other, self.sigma[other])))
            else:
                plans = [self._gather(p, self._plan(p, self.sigma[p])) for p in (0, 1)]
                for p in (0, 1):
                    self._update(p, plans[1 - p])

    # ---- results -------------------------------------------------------------------

    def average_local(self, p: int) -> Any:
        """Player p's average strategy on this rank's sequences."""
        return self._normalise(p, self.strategy_sum[p])

    def _sum(self, value: float) -> float:
        if self.comm is None:
            return value
        from mpi4py import MPI

        return self.comm.allreduce(value, op=MPI.SUM)

    def _average_plans(self) -> tuple[list[Any], list[Any]]:
        """Both players' average strategies (local) and realisation plans (gathered)."""
        avg = [self.average_local(p) for p in (0, 1)]
        return avg, [self._gather(p, self._plan(p, avg[p])) for p in (0, 1)]

    def nash_conv(self) -> float:
        """NashConv of the average strategy: the sum of both best-response gains."""
        avg, plans = self._average_plans()
        total = 0.0
        for p in (0, 1):
            q, _ = self._values(p, plans[1 - p], avg[p], best=True)
            total += self._sum(float(q[self.parts[p].L + 1]))
        return total

    def exploitability(self) -> float:
        """Half the NashConv (the mean best-response gain)."""
        return self.nash_conv() / 2

    def game_value(self) -> float:
        """Player 0's expected payoff when both play their average strategies."""
        avg, plans = self._average_plans()
        q, _ = self._values(0, plans[1], avg[0])
        return self._sum(float(q[self.parts[0].L + 1]))

    def average_policy(self) -> list[dict[str, dict[int, float]]]:
        """Per player ``{infoset string: {action: probability}}`` (gathered on every rank)."""
        out = []
        for p, seqs in enumerate(self.tree.players):
            part = self.parts[p]
            local = _host(self.average_local(p))
            full = np.zeros(seqs.n_seq)
            full[part.old_seqs] = local
            if self.comm is not None:
                from mpi4py import MPI

                self.comm.Allreduce(MPI.IN_PLACE, full, op=MPI.SUM)
            table = {}
            for i in range(seqs.n_infosets):
                first, n = int(seqs.first[i]), int(seqs.n_actions[i])
                acts = seqs.actions[first : first + n]
                table[str(seqs.keys[i])] = {
                    int(a): float(v) for a, v in zip(acts, full[first : first + n], strict=True)
                }
            out.append(table)
        return out

    # ---- checkpoint state --------------------------------------------------------------

    _ARRAYS = ("regret", "strategy_sum", "last_regret", "sigma")

    def state(self) -> dict[str, Any]:
        """This rank's solver state, for ``hpcpar.checkpoint`` (host arrays).

        Every array is this rank's ``Sharded`` block of the player's canonical sequence
        order, so the state restores on any number of ranks (``blocks()``).
        """
        from hpcpar.checkpoint import Sharded

        out: dict[str, Any] = {"t": self.t, "algorithm": self.algorithm, "game": self.tree.name}
        for p in (0, 1):
            part, total = self.parts[p], self.tree.players[p].n_seq - 1
            arrays = (self.regret, self.strategy_sum, self.last_regret, self.sigma)
            out[f"p{p}"] = {
                name: Sharded(_host(a[p])[part.to_canon], (total,), (part.offset,))
                for name, a in zip(self._ARRAYS, arrays, strict=True)
            }
        return out

    def blocks(self) -> dict[str, tuple[tuple[int], tuple[int]]]:
        """This rank's block of every array of ``state()``, by leaf name.

        ``Checkpointer.restore(reshard=solver.blocks())`` restores a state saved on any
        number of ranks onto this solver's.
        """
        return {
            f"p{p}/{name}": ((part.offset,), (part.L,))
            for p, part in enumerate(self.parts)
            for name in self._ARRAYS
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``state()`` of a run with the same game and algorithm.

        The arrays are this rank's blocks (``restore(reshard=solver.blocks())``), or the
        per-rank arrays of a run on the same number of ranks.

        Raises:
            CfrError: the state belongs to another game or algorithm, or its arrays do
                not fit this rank's part.
        """
        if "game" not in state or "algorithm" not in state:
            raise CfrError("checkpoint is of another app, not of cfr")
        if state.get("algorithm") != self.algorithm or state.get("game") != self.tree.name:
            raise CfrError(
                f"checkpoint is of {state.get('algorithm')} on {state.get('game')}, "
                f"not {self.algorithm} on {self.tree.name}"
            )
        from hpcpar.checkpoint import Sharded

        xp = self.xp
        loaded = []
        for p in (0, 1):
            part, saved = self.parts[p], state.get(f"p{p}")
            if not isinstance(saved, dict) or set(saved) != set(self._ARRAYS):
                raise CfrError(f"checkpoint has no solver arrays for player {p}")
            arrays = []
            for name in self._ARRAYS:
                value = saved[name]
                local = np.asarray(value)
                if isinstance(value, Sharded):  # canonical order: back to the local one
                    if value.offset != (part.offset,) or local.shape != (part.L,):
                        raise CfrError(
                            f"checkpoint block p{p}/{name} at {value.offset} of shape "
                            f"{local.shape} is not this rank's ({part.offset},) of ({part.L},)"
                        )
                    local = local[part.from_canon]
                elif local.shape != (part.L,):
                    raise CfrError("checkpoint arrays do not fit this tree and rank count")
                arrays.append(xp.asarray(local))
            loaded.append(arrays)
        for p, (regret, strategy_sum, last_regret, sigma) in enumerate(loaded):
            self.regret[p], self.strategy_sum[p] = regret, strategy_sum
            self.last_regret[p], self.sigma[p] = last_regret, sigma
        self.t = int(state["t"])


def _roots(seqs: PlayerSeqs) -> np.ndarray:
    """The root infoset of every infoset's subtree."""
    root = np.arange(seqs.n_infosets)
    inf_of = seqs.infoset_of_seq()
    for i in range(seqs.n_infosets):  # parents come first (depth order)
        if seqs.parent[i] != 0:
            root[i] = root[inf_of[seqs.parent[i]]]
    return root


def _sequences(seqs: PlayerSeqs, infosets: np.ndarray) -> np.ndarray:
    """The sequence numbers of ``infosets``' actions, infoset by infoset."""
    if not infosets.size:
        return np.zeros(0, np.int64)
    n = seqs.n_actions[infosets]
    starts = np.repeat(seqs.first[infosets] - np.concatenate([[0], np.cumsum(n)[:-1]]), n)
    return starts + np.arange(int(n.sum()))


def _partition(seqs: PlayerSeqs, root: np.ndarray, size: int) -> np.ndarray:
    """Owner rank per infoset: whole root subtrees in order, balanced by sequence count.

    Owners do not decrease along the roots, so each rank's subtrees are consecutive.
    """
    n = seqs.n_infosets
    roots = np.unique(root)
    weight = np.bincount(root, weights=seqs.n_actions, minlength=n)[roots]
    cut = np.cumsum(weight) - weight / 2  # each subtree goes where its middle falls
    owner_of_root = np.minimum((cut * size / max(weight.sum(), 1)).astype(np.int64), size - 1)
    owner = np.zeros(n, dtype=np.int64)
    owner[roots] = owner_of_root
    return owner[root]


def _backend(device: str) -> tuple[Any, Any]:
    if device == "cpu":
        from scipy import sparse

        return np, sparse
    if device == "gpu":
        try:
            import cupy
            from cupyx.scipy import sparse

            cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # no cupy, no driver or no device
            raise CfrError(f"device gpu needs cupy and a GPU ({exc.__class__.__name__})") from None
        return cupy, sparse
    raise CfrError(f"unknown device {device!r} (cpu or gpu)")


def _csr(sparse: Any, xp: Any, vals: Any, rows: Any, cols: Any, shape: tuple[int, int]) -> Any:
    from scipy import sparse as host_sparse

    matrix = host_sparse.csr_matrix((vals, (rows, cols)), shape=shape)
    matrix.sort_indices()  # each row's terms in canonical column order: the same at any rank count
    if xp is np:
        return matrix
    return sparse.csr_matrix(matrix)


def _host(array: Any) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)
