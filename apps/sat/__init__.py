"""hpcpar.apps.sat: stochastic local search for SAT, an MPI portfolio, runtime distributions.

``read_dimacs`` / ``write_dimacs`` / ``random_ksat`` / ``check_model`` handle formulas;
``LocalSearch`` runs probSAT, WalkSAT-SKC or configuration checking with compiled
inner loops; ``portfolio`` races independent runs on every rank; ``predict`` fits the
sequential runtime distribution and predicts the portfolio's speedup by order
statistics; ``hpcpar sat`` is the command line.
"""

from __future__ import annotations

from .cnf import CNF, SatError, check_model, random_ksat, read_dimacs, write_dimacs
from .solver import ALGORITHMS, LocalSearch

__all__ = [
    "ALGORITHMS",
    "CNF",
    "LocalSearch",
    "SatError",
    "check_model",
    "random_ksat",
    "read_dimacs",
    "write_dimacs",
]
