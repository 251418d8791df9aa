"""The algorithms: one module each, holding everything about it; this package registers them.

Each module describes itself in ``ALGORITHMS``, a tuple of ``registry.Algorithm``
records, one per collective it serves (schedule, properties, exact counts, cost terms,
label). ``BUILTIN`` lists the modules; adding an algorithm is one new module here and
its name in that list (or ``registry.register`` from anywhere else).
"""

from __future__ import annotations

import importlib

from ..registry import TABLE, Algorithm, register

__all__ = ["ALGORITHMS", "BUILTIN", "Algorithm"]

BUILTIN = (  # flat ones first: the order algorithms_for() lists them in
    "mpi",
    "ring",
    "recursive_doubling",
    "rabenseifner",
    "binomial",
    "scatter_allgather",
    "pairwise",
    "bruck",
    "dissemination",
    "two_level",
    "multi_leader",
    "pipelined",
)

for _name in BUILTIN:
    register(*importlib.import_module(f"{__name__}.{_name}").ALGORITHMS)

ALGORITHMS = TABLE  # collective -> algorithm name -> record
