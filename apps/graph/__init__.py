"""hpcpar.apps.graph: the Graph500 benchmark, distributed (BFS, SSSP, validation, TEPS).

``kronecker(scale, edgefactor, seed, part, parts)`` produces any slice of the
specification's edge list, identical for every rank count; ``DistGraph.build`` partitions
it (``1d-vertex``, ``1d-edge``, ``2d``, ``hier``); ``bfs``/``sssp`` search it;
``validate`` checks a result against the edge list; ``driver.run`` is the benchmark
behind ``hpcpar graph``. The MPI-using names are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .kronecker import EdgeList, GraphError, feistel_permute, kronecker
from .names import PARTITIONS

__all__ = ["EdgeList", "GraphError", "feistel_permute", "kronecker", "PARTITIONS",
           "DistGraph", "bfs", "sssp", "validate", "read_edges"]  # fmt: skip

_LAZY = {"DistGraph": ".graph", "bfs": ".search", "sssp": ".search", "validate": ".validate",
         "read_edges": ".edgefile"}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hpcpar.apps.graph' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
