"""The stand-in's cupyx (see tests/standin/cupy): pinned buffers are plain host arrays."""

import numpy as np


def empty_pinned(shape, dtype=np.float64):
    return np.empty(shape, dtype)
