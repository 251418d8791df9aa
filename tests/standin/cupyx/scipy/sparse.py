"""The stand-in's cupyx.scipy.sparse: scipy's matrices, taking and giving device arrays."""

import cupy
from scipy import sparse as _host


class csr_matrix:
    def __init__(self, matrix):
        if isinstance(matrix, csr_matrix):
            matrix = matrix.m
        if not _host.issparse(matrix):
            raise TypeError("the stand-in builds device matrices from host scipy matrices")
        self.m = _host.csr_matrix(matrix, copy=True)

    shape = property(lambda s: s.m.shape)
    T = property(lambda s: csr_matrix(s.m.T.tocsr()))

    def __matmul__(self, other):
        return cupy._wrap(self.m @ cupy._guard(other))

    def dot(self, other):
        return self @ other

    def __rmatmul__(self, other):
        return cupy._wrap(cupy._guard(other) @ self.m)
