"""hpcpar.apps.sgd: data-parallel SGD on numpy models (sync, local, async, hogwild).

``make_model`` builds softmax regression or a small MLP with manual backprop,
``load_dataset`` loads scikit-learn's bundled datasets or synthetic data, and
``SyncTrainer`` trains with bucketed gradient ``hpcpar.iallreduce`` overlapped with the
backward pass (``mode="local"``: local SGD); ``async_ps.AsyncTrainer`` is asynchronous
SGD with a parameter server; ``hogwild.HogwildTrainer`` shares one model per node in an
MPI shared-memory window. ``hpcpar.apps.sgd.torch.DataParallel`` trains PyTorch models
data-parallel over the same collectives. ``hpcpar bench sgd`` compares the modes with
PyTorch DDP.
"""

from __future__ import annotations

from .data import DATASETS, Dataset, load_dataset
from .models import MODELS, Model, SgdError, make_model
from .train import EpochStats, SyncTrainer

__all__ = [
    "DATASETS",
    "Dataset",
    "EpochStats",
    "MODELS",
    "Model",
    "SgdError",
    "SyncTrainer",
    "load_dataset",
    "make_model",
]
