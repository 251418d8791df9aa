"""Datasets: scikit-learn's bundled ones (no download) and synthetic dense or sparse data."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .models import SgdError

__all__ = [
    "Dataset",
    "load_dataset",
    "DATASETS",
    "epoch_order",
    "strided_batches",
    "shard_bounds",
    "shard_order",
    "batch_rows",
    "local_shard_order",
]

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
    shard: tuple[int, int] | None = None  # (part, parts) when x_train is one shard
    n_total: int = 0  # training rows in all shards together

    def __post_init__(self) -> None:
        if not self.n_total:
            self.n_total = int(self.y_train.size)

    @property
    def n_features(self) -> int:
        """Columns of the feature matrix."""
        return int(self.x_train.shape[1])


def shard_bounds(rows: int, part: int, parts: int) -> tuple[int, int]:
    """The contiguous block [lo, hi) of ``rows`` training rows that shard ``part`` holds."""
    return rows * part // parts, rows * (part + 1) // parts


@functools.lru_cache(maxsize=8)
def shard_order(seed: int, epoch: int, part: int, parts: int, rows: int) -> np.ndarray:
    """Shard ``part``'s training rows (global positions) in their order in ``epoch``.

    Each shard shuffles only its own rows, so a rank that holds one shard never needs
    another's; a global batch is the concatenation of every shard's next rows.
    """
    lo, hi = shard_bounds(rows, part, parts)
    order = lo + np.random.default_rng([seed, epoch, part, parts]).permutation(hi - lo)
    order.flags.writeable = False
    return order


@functools.lru_cache(maxsize=2)
def epoch_order(seed: int, epoch: int, rows: int) -> np.ndarray:
    """The training rows' order in ``epoch`` (the same on every rank; computed once)."""
    order = np.random.default_rng([seed, epoch]).permutation(rows)
    order.flags.writeable = False
    return order


def batch_rows(
    seed: int, epoch: int, rows: int, index: int, batch: int, rank: int, ranks: int
) -> np.ndarray:
    """Rank ``rank``'s rows of global batch ``index`` under one global shuffle."""
    mine = batch // ranks
    start = index * batch + rank * mine
    return epoch_order(seed, epoch, rows)[start : start + mine]


def local_shard_order(seed: int, epoch: int, data: Dataset) -> np.ndarray:
    """``shard_order`` of the shard ``data`` holds, as row numbers of ``data.x_train``."""
    assert data.shard is not None
    lo = shard_bounds(data.n_total, *data.shard)[0]
    return shard_order(seed, epoch, *data.shard, data.n_total) - lo


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
    _check_xy(file, x, y)
    return _split(file.name, x.astype(np.float64), y, seed)


def _check_xy(file: Any, x: Any, y: np.ndarray) -> np.ndarray:
    """Check a user file's ``x`` (array or h5py dataset) and ``y``; returns the classes."""
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise SgdError(
            f"{file}: x must be rows x features and y one label per row; "
            f"got x {x.shape}, y {y.shape}"
        )
    if x.dtype.kind not in "fiu" or y.dtype.kind not in "iu":
        raise SgdError(f"{file}: x must be numeric and y integer labels (got {x.dtype}, {y.dtype})")
    classes = np.unique(y)
    if classes.size < 2:
        raise SgdError(f"{file}: y holds fewer than two classes")
    return classes


_BUNDLED = {
    "digits": "digits.csv.gz",
    "breast_cancer": "breast_cancer.csv",
    "wine": "wine_data.csv",
}


def _bundled(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of one of scikit-learn's bundled datasets.

    Read from the CSV files scikit-learn ships, without importing scikit-learn (whose
    import takes longer than reading them); its loader is the fallback.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SgdError(f"dataset {name} needs scikit-learn (pip install scikit-learn)")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / _BUNDLED[name]
    if not path.is_file():
        from sklearn import datasets

        bunch = getattr(datasets, f"load_{name}")()
        return bunch.data.astype(np.float64), np.asarray(bunch.target, dtype=np.int64)
    # digits: 64 pixels and the label per row; the others start with a line of sizes
    table = np.loadtxt(path, delimiter=",", skiprows=0 if name == "digits" else 1)
    return table[:, :-1].copy(), table[:, -1].astype(np.int64)


def load_dataset(
    name: str, seed: int = 0, shard: tuple[int, int] | None = None, comm: Any = None
) -> Dataset:
    """A dataset by name (or a ``.npz``/``.h5`` path), split 80/20 with ``seed``.

    With ``shard=(part, parts)`` only that block of the training rows is kept (the test
    rows are kept whole); an ``.h5`` file is then read only for those rows and the test
    rows (and its labels), the standardisation coming from moments summed over
    ``comm`` (every shard's rows); the other sources are loaded whole, then cut.

    Raises:
        SgdError: an unknown name, or scikit-learn missing for its bundled datasets.
    """
    if shard is not None:
        part, parts = shard
        if not 0 <= part < parts:
            raise SgdError(f"shard {part} of {parts} does not exist")
        if name.endswith((".h5", ".hdf5")):
            return _load_h5_shard(name, seed, shard, comm)
        data = load_dataset(name, seed)
        lo, hi = shard_bounds(data.y_train.size, part, parts)
        if hi - lo < 1:
            raise SgdError(f"{name}: {data.y_train.size} training rows for {parts} shards")
        return Dataset(
            data.name,
            data.x_train[lo:hi],
            data.y_train[lo:hi],
            data.x_test,
            data.y_test,
            data.n_classes,
            shard,
            data.y_train.size,
        )
    if name.endswith((".npz", ".h5", ".hdf5")):
        return load_file(name, seed)
    if name in _BUNDLED:
        x, y = _bundled(name)
        return _split(name, x, y, seed)
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


def _rows_of(dataset: Any, rows: np.ndarray) -> np.ndarray:
    """``dataset[rows]`` for any order of ``rows`` (h5py reads increasing indices only)."""
    order = np.argsort(rows)
    out = np.empty((rows.size, *dataset.shape[1:]), dtype=np.float64)
    if rows.size:
        out[order] = dataset[rows[order]]
    return out


def _load_h5_shard(path: str, seed: int, shard: tuple[int, int], comm: Any) -> Dataset:
    """One shard of an ``.h5`` file's training rows, and its test rows (see load_dataset)."""
    import h5py

    file = Path(path)
    try:
        with h5py.File(file, "r") as f:
            xd, y = f["x"], np.asarray(f["y"][()])
            classes = _check_xy(file, xd, y)
            order = np.random.default_rng(seed).permutation(y.size)
            cut = int(0.8 * y.size)
            lo, hi = shard_bounds(cut, *shard)
            mine, test = order[lo:hi], order[cut:]
            x, x_test = _rows_of(xd, mine), _rows_of(xd, test)
    except KeyError as exc:
        raise SgdError(f"{file}: needs arrays 'x' and 'y' (missing {exc})") from None
    except OSError as exc:
        raise SgdError(f"{file}: not a readable .h5 file ({exc.__class__.__name__})") from None
    if hi - lo < 1:
        raise SgdError(f"{file}: {cut} training rows for {shard[1]} shards")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(x_test))):
        raise SgdError(f"dataset {file.name}: features contain NaN or infinity")
    moments = np.concatenate([x.sum(axis=0), (x * x).sum(axis=0)])
    if comm is not None:
        from hpcpar.runtime.comm import resolve_comm

        total = np.empty_like(moments)
        resolve_comm(comm).Allreduce(moments, total)
        moments = total
    d = x.shape[1]
    mean = moments[:d] / cut
    std = np.sqrt(np.maximum(moments[d:] / cut - mean * mean, 0.0))
    std[std == 0] = 1.0
    y = np.searchsorted(classes, y)
    return Dataset(
        file.name,
        (x - mean) / std,
        y[mine],
        (x_test - mean) / std,
        y[test],
        int(classes.size),
        shard,
        cut,
    )
