"""hpcpar.apps.cfr: vectorised, MPI-parallel CFR and its variants on two-player games.

``build_tree(game)`` compiles Kuhn or Leduc poker (built in) or any two-player zero-sum
OpenSpiel game to sequence form; ``Solver(tree, algorithm)`` runs CFR, CFR+, Linear
CFR, Discounted CFR or Predictive CFR+ on one rank or many; ``hpcpar cfr`` is the
command line.
"""

from __future__ import annotations

from .games import BUILTIN_GAMES, CfrError
from .solver import ALGORITHMS, Solver
from .tree import Tree, build_tree, load_tree

__all__ = ["ALGORITHMS", "BUILTIN_GAMES", "CfrError", "Solver", "Tree", "build_tree", "load_tree"]
