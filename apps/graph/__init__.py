"""hpcpar.apps.graph: Graph500 (work in progress: the Kronecker generator so far).

``kronecker(scale, edgefactor, seed, part, parts)`` produces any slice of the
specification's edge list, identical for every rank count.
"""

from __future__ import annotations

from .kronecker import EdgeList, GraphError, feistel_permute, kronecker

__all__ = ["EdgeList", "GraphError", "feistel_permute", "kronecker"]
