"""Datasets: scikit-learn's bundled ones (no download) and synthetic dense or sparse data."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .models import SgdError

__all__ = ["Dataset", "load_dataset", "DATASETS", "epoch_order", "strided_batches"]

DATASETS = ("digits", "breast_cancer", "wine", "synthetic", "synthetic_sparse")


@dataclass
class Dataset:
    """Train and test splits (features standardised on the training split)."""

    name: str
    x_train: Any
    y_train: np.ndarray
    x_test: Any
    y_test: np.ndarray
    n_classes: int

    @property
    def n_features(self) -> int:
        """Columns of the feature matrix."""
        return int(self.x_train.shape[1])


@functools.lru_cache(maxsize=2)
def epoch_order(seed: int, epoch: int, rows: int) -> np.ndarray:
    """The training rows' order in ``epoch`` (the same on every rank; computed once)."""
    order = np.random.default_rng([seed, epoch]).permutation(rows)
    order.flags.writeable = False
    return order


def strided_batches(order: np.ndarray, part: int, parts: int, batch: int) -> list[np.ndarray]:
    """Part ``part`` of ``parts`` of an epoch (every parts-th row), in whole batches."""
    mine = order[part::parts]
    return [mine[i : i + batch] for i in range(0, mine.size - batch + 1, batch)]


def _split(name: str, x: Any, y: np.ndarray, seed: int) -> Dataset:
    if not np.all(np.isfinite(x.data if hasattr(x, "tocsr") else x)):
        raise SgdError(f"dataset {name}: features contain NaN or infinity")
    order = np.random.default_rng(seed).permutation(y.size)
    cut = int(0.8 * y.size)
    train, test = order[:cut], order[cut:]
    x_train, x_test = x[train], x[test]
    if not hasattr(x, "tocsr"):
        mean, std = x_train.mean(axis=0), x_train.std(axis=0)
        std[std == 0] = 1.0
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    classes = np.unique(y)
    y = np.searchsorted(classes, y)
    return Dataset(name, x_train, y[train], x_test, y[test], int(classes.size))


def load_file(path: str, seed: int = 0) -> Dataset:
    """User data: a ``.npz`` or ``.h5`` file with ``x`` (rows x features) and ``y`` (labels).

    Nothing is unpickled; the arrays are checked.

    Raises:
        SgdError: unreadable file, missing arrays, mismatched shapes, NaN or infinity,
            non-integer labels, fewer than two classes.
    """
    from pathlib import Path

    file = Path(path)
    try:
        if file.suffix in (".h5", ".hdf5"):
            import h5py

            with h5py.File(file, "r") as f:
                x, y = np.asarray(f["x"][()]), np.asarray(f["y"][()])
        else:
            with np.load(file, allow_pickle=False) as f:
                x, y = f["x"], f["y"]
    except KeyError as exc:
        raise SgdError(f"{file}: needs arrays 'x' and 'y' (missing {exc})") from None
    except (OSError, ValueError) as exc:
        raise SgdError(
            f"{file}: not a readable .npz or .h5 file ({exc.__class__.__name__})"
        ) from None
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise SgdError(
            f"{file}: x must be rows x features and y one label per row; "
            f"got x {x.shape}, y {y.shape}"
        )
    if x.dtype.kind not in "fiu" or y.dtype.kind not in "iu":
        raise SgdError(f"{file}: x must be numeric and y integer labels (got {x.dtype}, {y.dtype})")
    if np.unique(y).size < 2:
        raise SgdError(f"{file}: y holds fewer than two classes")
    return _split(file.name, x.astype(np.float64), y, seed)


def load_dataset(name: str, seed: int = 0) -> Dataset:
    """A dataset by name (or a ``.npz``/``.h5`` path), split 80/20 with ``seed``.

    Raises:
        SgdError: an unknown name, or scikit-learn missing for its bundled datasets.
    """
    if name.endswith((".npz", ".h5", ".hdf5")):
        return load_file(name, seed)
    if name in ("digits", "breast_cancer", "wine"):
        try:
            from sklearn import datasets
        except ImportError:
            raise SgdError(
                f"dataset {name} needs scikit-learn (pip install scikit-learn)"
            ) from None
        bunch = getattr(datasets, f"load_{name}")()
        return _split(name, bunch.data.astype(np.float64), bunch.target, seed)
    rng = np.random.default_rng(1000 + seed)
    if name == "synthetic":
        n, d, k = 20000, 100, 10
        centres = rng.standard_normal((k, d)) * 1.5
        y = rng.integers(0, k, n)
        return _split(name, centres[y] + rng.standard_normal((n, d)), y, seed)
    if name == "synthetic_sparse":
        from scipy import sparse

        n, d, k, nnz = 20000, 2000, 4, 30
        w = rng.standard_normal((d, k))
        cols = rng.integers(0, d, (n, nnz))
        vals = rng.random((n, nnz))
        x = sparse.csr_matrix(
            (vals.ravel(), cols.ravel(), np.arange(0, n * nnz + 1, nnz)), shape=(n, d)
        )
        y = np.asarray((x @ w).argmax(axis=1)).ravel()
        return _split(name, x, y, seed)
    raise SgdError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
