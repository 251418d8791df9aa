"""A game compiled to sequence form: per-player sequence trees and a sparse payoff matrix.

For each player, sequences are (infoset, action) pairs plus the empty sequence 0;
infosets are ordered by their own depth (the number of the player's earlier actions), so
one pass per depth computes realisation plans forwards or counterfactual values
backwards. Every terminal history adds ``chance probability x payoff`` to
``A[seq0, seq1]``, the last sequences of the two players on its path; ``x^T A y`` is then
player 0's expected payoff. A tree is built once and saved to ``.npz`` or ``.h5`` (plain
arrays, loaded without pickle and checked).
"""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .games import CfrError, root_state

__all__ = ["Tree", "compile_tree", "load_tree", "build_tree"]


@dataclass
class PlayerSeqs:
    """One player's sequence tree.

    Attributes:
        parent: Per infoset, the sequence that leads to it (0: none before).
        first: Per infoset, its first sequence (its actions' sequences are consecutive).
        n_actions: Per infoset, its number of actions.
        depth: Per infoset, its own depth (0 for the player's first decisions).
        actions: Per sequence (index 0 unused: -1), the game's action number.
        keys: Per infoset, the game's information-state string.
    """

    parent: np.ndarray
    first: np.ndarray
    n_actions: np.ndarray
    depth: np.ndarray
    actions: np.ndarray
    keys: np.ndarray

    @property
    def n_seq(self) -> int:
        return int(self.actions.size)

    @property
    def n_infosets(self) -> int:
        return int(self.parent.size)

    def infoset_of_seq(self) -> np.ndarray:
        """Per sequence its infoset (-1 for the empty sequence)."""
        out = np.full(self.n_seq, -1, dtype=np.int64)
        out[1:] = np.repeat(np.arange(self.n_infosets), self.n_actions)
        return out


@dataclass
class Tree:
    """A compiled two-player zero-sum game.

    Attributes:
        name: The game.
        players: The two players' sequence trees.
        rows, cols, vals: ``A`` in coordinate form (duplicates already summed).
        n_nodes: Histories in the game tree (chance, decision and terminal).
        n_terminals: Terminal histories.
    """

    name: str
    players: list[PlayerSeqs]
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    n_nodes: int
    n_terminals: int
    meta: dict[str, Any] = field(default_factory=dict)

    def matrix(self) -> Any:
        """``A`` as a scipy CSR matrix (rows: player 0's sequences)."""
        from scipy import sparse

        shape = (self.players[0].n_seq, self.players[1].n_seq)
        return sparse.csr_matrix((self.vals, (self.rows, self.cols)), shape=shape)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array, by name (what ``save`` writes)."""
        out = {
            "name": np.array(self.name),
            "rows": self.rows,
            "cols": self.cols,
            "vals": self.vals,
            "counts": np.array([self.n_nodes, self.n_terminals], dtype=np.int64),
        }
        for p, seqs in enumerate(self.players):
            for part in ("parent", "first", "n_actions", "depth", "actions", "keys"):
                out[f"p{p}_{part}"] = getattr(seqs, part)
        return out

    def save(self, path: Any) -> None:
        """Write ``.npz`` or ``.h5`` (by suffix)."""
        path = Path(path)
        arrays = self.arrays()
        if path.suffix in (".h5", ".hdf5"):
            import h5py

            with h5py.File(path, "w") as f:
                for name, value in arrays.items():
                    text = value.dtype.kind == "U"
                    f.create_dataset(name, data=np.char.encode(value, "utf-8") if text else value)
        elif path.suffix == ".npz":
            np.savez_compressed(path, **arrays)
        else:
            raise CfrError(f"{path}: save trees as .npz or .h5")

    def same_as(self, other: Tree) -> bool:
        """Whether two trees are the same game (all arrays but the infoset strings)."""
        a, b = self.arrays(), other.arrays()
        skip = {"name", "p0_keys", "p1_keys"}
        return all(
            a[k].shape == b[k].shape and np.array_equal(a[k], b[k]) for k in a if k not in skip
        )


PROGRESS_NODES = 1 << 16  # the walk reports its progress every this many nodes


def compile_tree(root: Any, name: str, progress: Callable[[int], None] | None = None) -> Tree:
    """Walk a game from ``root`` and build its sequence form.

    ``progress(nodes)`` is called every ``PROGRESS_NODES`` nodes walked (a large game
    takes minutes).

    Raises:
        CfrError: the game lacks perfect recall (an infoset reached after different own
            sequences, or with different actions), or a chance node's probabilities do
            not add up to 1.
    """
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    ids: list[dict[str, int]] = [{}, {}]
    parent: list[list[tuple[int, int] | None]] = [[], []]
    actions: list[list[list[int]]] = [[], []]
    keys: list[list[str]] = [[], []]
    terminals: list[tuple[Any, Any, float]] = []
    nodes = [0]

    def walk(state: Any, seqs: tuple[Any, Any], chance: float) -> None:
        nodes[0] += 1
        if progress is not None and nodes[0] % PROGRESS_NODES == 0:
            progress(nodes[0])
        if state.is_terminal():
            terminals.append((seqs[0], seqs[1], chance * state.returns0()))
            return
        if state.is_chance():
            outcomes = state.chance_outcomes()
            if abs(sum(p for _, p in outcomes) - 1.0) > 1e-9:
                raise CfrError(f"{name}: chance probabilities do not add up to 1")
            for action, prob in outcomes:
                walk(state.child(action), seqs, chance * prob)
            return
        player = state.current_player()
        if player not in (0, 1):
            raise CfrError(f"{name}: player {player} acts; only two-player games are solved")
        key, legal = state.info_key(player), list(state.legal_actions())
        infoset = ids[player].get(key)
        if infoset is None:
            infoset = ids[player][key] = len(keys[player])
            keys[player].append(key)
            parent[player].append(seqs[player])
            actions[player].append(legal)
        elif parent[player][infoset] != seqs[player] or actions[player][infoset] != legal:
            raise CfrError(f"{name}: infoset {key!r} breaks perfect recall")
        for slot, action in enumerate(legal):
            mine = (infoset, slot)
            walk(state.child(action), (mine, seqs[1]) if player == 0 else (seqs[0], mine), chance)

    walk(root, (None, None), 1.0)
    players, index = [], []
    for p in (0, 1):
        seqs, where = _number(parent[p], actions[p], keys[p])
        players.append(seqs)
        index.append(where)
    rows = np.array([0 if s is None else index[0][s] for s, _, _ in terminals], dtype=np.int64)
    cols = np.array([0 if s is None else index[1][s] for _, s, _ in terminals], dtype=np.int64)
    vals = np.array([v for _, _, v in terminals], dtype=np.float64)
    # sum duplicate (row, col) pairs in terminal order, then order by row and column
    pair = rows * players[1].n_seq + cols
    order = np.argsort(pair, kind="stable")
    unique, start = np.unique(pair[order], return_index=True)
    summed = np.add.reduceat(vals[order], start) if vals.size else vals
    return Tree(
        name=name,
        players=players,
        rows=(unique // players[1].n_seq).astype(np.int64),
        cols=(unique % players[1].n_seq).astype(np.int64),
        vals=summed.astype(np.float64),
        n_nodes=nodes[0],
        n_terminals=len(terminals),
    )


def _number(
    parent: list[Any], actions: list[list[int]], keys: list[str]
) -> tuple[PlayerSeqs, dict[tuple[int, int], int]]:
    """Order infosets by own depth (stable) and number their sequences from 1."""
    n = len(parent)
    depth = [0] * n
    for i in range(n):  # a parent infoset is always met before its children
        depth[i] = 0 if parent[i] is None else depth[parent[i][0]] + 1
    order = sorted(range(n), key=lambda i: depth[i])
    first, where = {}, {}
    seq = 1
    for i in order:
        first[i] = seq
        for slot in range(len(actions[i])):
            where[(i, slot)] = seq
            seq += 1
    seq_actions = np.full(seq, -1, dtype=np.int64)
    for i in order:
        seq_actions[first[i] : first[i] + len(actions[i])] = actions[i]
    seqs = PlayerSeqs(
        parent=np.array([0 if parent[i] is None else where[parent[i]] for i in order], np.int64),
        first=np.array([first[i] for i in order], dtype=np.int64),
        n_actions=np.array([len(actions[i]) for i in order], dtype=np.int64),
        depth=np.array([depth[i] for i in order], dtype=np.int64),
        actions=seq_actions,
        keys=np.array([keys[i] for i in order], dtype=str) if n else np.array([], dtype="U1"),
    )
    return seqs, where


def build_tree(
    game: str, source: str = "auto", progress: Callable[[int], None] | None = None
) -> Tree:
    """Compile a built-in or OpenSpiel game (see ``games.root_state``; ``compile_tree``)."""
    return compile_tree(root_state(game, source), game, progress)


def load_tree(path: Any) -> Tree:
    """Read a tree written by ``Tree.save`` and check it (no pickle).

    Raises:
        CfrError: unreadable, missing arrays, or inconsistent indices.
    """
    path = Path(path)
    try:
        if path.suffix in (".h5", ".hdf5"):
            import h5py

            with h5py.File(path, "r") as f:
                raw = {k: f[k][()] for k in f}
            raw = {
                k: (np.char.decode(v, "utf-8") if v.dtype.kind == "S" else v)
                for k, v in raw.items()
            }
            raw["name"] = np.array(
                raw["name"].decode() if isinstance(raw["name"], bytes) else raw["name"]
            )
        else:
            with np.load(path, allow_pickle=False) as f:
                raw = {k: f[k] for k in f.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise CfrError(f"{path}: not a readable tree file ({exc.__class__.__name__})") from None
    try:
        players = [
            PlayerSeqs(
                **{
                    part: np.asarray(raw[f"p{p}_{part}"])
                    for part in ("parent", "first", "n_actions", "depth", "actions", "keys")
                }
            )
            for p in (0, 1)
        ]
        counts = raw["counts"]
        tree = Tree(
            str(raw["name"]),
            players,
            raw["rows"],
            raw["cols"],
            raw["vals"],
            int(counts[0]),
            int(counts[1]),
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise CfrError(f"{path}: not a tree file (missing {exc})") from None
    _check(tree, path)
    return tree


def _check(tree: Tree, path: Path) -> None:
    for p, s in enumerate(tree.players):
        n = s.n_infosets
        ints = [s.parent, s.first, s.n_actions, s.depth, s.actions]
        if any(a.dtype.kind != "i" for a in ints) or s.keys.shape != (n,):
            raise CfrError(f"{path}: player {p}'s arrays have wrong types or sizes")
        if not (s.first.shape == s.n_actions.shape == s.depth.shape == (n,)):
            raise CfrError(f"{path}: player {p}'s infoset arrays differ in length")
        expect = 1 + np.concatenate([[0], np.cumsum(s.n_actions)[:-1]]) if n else s.first
        if np.any(s.n_actions < 1) or not np.array_equal(s.first, expect):
            raise CfrError(f"{path}: player {p}'s sequences are not laid out per infoset")
        if s.n_seq != 1 + int(s.n_actions.sum()) or np.any(s.parent < 0):
            raise CfrError(f"{path}: player {p}'s sequence count does not match")
        if np.any(s.parent >= s.first) or np.any(np.diff(s.depth) < 0):
            raise CfrError(f"{path}: player {p}'s infosets are not in depth order")
    n0, n1 = tree.players[0].n_seq, tree.players[1].n_seq
    r, c, v = tree.rows, tree.cols, tree.vals
    if not (r.shape == c.shape == v.shape) or r.dtype.kind != "i" or c.dtype.kind != "i":
        raise CfrError(f"{path}: payoff arrays differ in length or type")
    if r.size and (r.min() < 0 or r.max() >= n0 or c.min() < 0 or c.max() >= n1):
        raise CfrError(f"{path}: payoff indices out of range")
    if not np.all(np.isfinite(v)) or v.dtype != np.float64:
        raise CfrError(f"{path}: payoffs must be finite float64")
