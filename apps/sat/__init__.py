"""hpcpar.apps.sat: stochastic local search for SAT, an MPI portfolio, runtime distributions.

``read_dimacs`` / ``write_dimacs`` / ``random_ksat`` / ``check_model`` handle formulas;
``LocalSearch`` runs probSAT, WalkSAT-SKC or configuration checking with compiled
inner loops; ``portfolio`` races independent runs on every rank; ``predict`` fits the
sequential runtime distribution and predicts the portfolio's speedup by order
statistics; ``hpcpar sat`` is the command line. The names load on first use, so a
program that only registers the command line does not compile the kernels' modules.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "ALGORITHMS": ".solver",
    "LocalSearch": ".solver",
    "CNF": ".cnf",
    "SatError": ".cnf",
    "check_model": ".cnf",
    "random_ksat": ".cnf",
    "read_dimacs": ".cnf",
    "write_dimacs": ".cnf",
}

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


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
