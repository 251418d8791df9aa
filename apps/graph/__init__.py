"""hpcpar.apps.graph: the Graph500 benchmark, distributed (BFS, SSSP, validation, TEPS).

``kronecker(scale, edgefactor, seed, part, parts)`` produces any slice of the
specification's edge list, identical for every rank count. The MPI-using parts are
submodules (imported when needed, so this package stays light for the command line):
``graph.DistGraph.build`` partitions a graph (``1d-vertex``, ``1d-edge``, ``2d``,
``hier``: ``partition``), ``search.bfs``/``search.sssp`` search it, ``validate.validate``
checks a result against the edge list, ``edgefile.read_edges`` reads files, and
``driver.run`` is the benchmark behind ``hpcpar graph``.
"""

from __future__ import annotations

from .kronecker import EdgeList, GraphError, feistel_permute, kronecker
from .names import PARTITIONS

__all__ = ["EdgeList", "GraphError", "feistel_permute", "kronecker", "PARTITIONS"]
