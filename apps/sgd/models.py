"""Models in numpy with manual backprop: softmax regression and a small MLP.

Parameters live in one flat float64 vector (``model.params``); each layer's weights
and biases are views into it, and gradients are written into a flat vector of the
same layout. The backward pass produces gradients from the last layer to the first and
calls ``on_ready(start, stop)`` for each finished slice, so a data-parallel trainer can
start reducing a bucket while earlier layers are still being differentiated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hpcpar.errors import HpcparError

__all__ = ["SgdError", "Model", "make_model", "output_delta", "MODELS"]


class SgdError(HpcparError):
    """A dataset, model, mode or parameter the SGD app cannot use."""


class Model:
    """A stack of dense layers (tanh between them) ending in softmax cross-entropy.

    Args:
        sizes: Layer widths from inputs to classes, e.g. ``[64, 10]`` (softmax
            regression) or ``[64, 32, 10]`` (one hidden layer).
        seed: Initialisation seed (Glorot-uniform weights, zero biases).
    """

    def __init__(self, sizes: list[int], seed: int = 0) -> None:
        if len(sizes) < 2 or any(int(s) < 1 for s in sizes):
            raise SgdError(f"layer sizes must be >= 1 and at least two, not {sizes}")
        self.sizes = [int(s) for s in sizes]
        shapes = [(a, b) for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True)]
        self.slices: list[tuple[slice, slice]] = []
        pos = 0
        for a, b in shapes:
            w = slice(pos, pos + a * b)
            pos += a * b
            bias = slice(pos, pos + b)
            pos += b
            self.slices.append((w, bias))
        self.params = np.zeros(pos)
        rng = np.random.default_rng(seed)
        for (a, b), (w, _) in zip(shapes, self.slices, strict=True):
            limit = np.sqrt(6.0 / (a + b))
            self.params[w] = rng.uniform(-limit, limit, a * b)

    @property
    def n_params(self) -> int:
        """Length of the flat parameter vector."""
        return self.params.size

    def layers(self, flat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """(W, b) views of ``flat`` per layer (W: inputs x outputs)."""
        out = []
        for (a, b), (w, bias) in zip(
            zip(self.sizes[:-1], self.sizes[1:], strict=True), self.slices, strict=True
        ):
            out.append((flat[w].reshape(a, b), flat[bias]))
        return out

    def forward(self, x: Any) -> tuple[list[Any], np.ndarray]:
        """Activations per layer input and the class probabilities."""
        acts = [x]
        h = x
        layers = self.layers(self.params)
        for i, (w, b) in enumerate(layers):
            z = h @ w + b
            if i < len(layers) - 1:
                h = np.tanh(z)
                acts.append(h)
            else:
                z = z - z.max(axis=1, keepdims=True)
                e = np.exp(z)
                return acts, e / e.sum(axis=1, keepdims=True)
        raise AssertionError("unreachable")

    def loss_and_grad(
        self,
        x: Any,
        y: np.ndarray,
        grad: np.ndarray,
        scale: float,
        on_ready: Callable[[int, int], None] | None = None,
    ) -> float:
        """Summed cross-entropy of the batch; ``grad`` gets ``scale x`` its gradient.

        ``on_ready(start, stop)`` is called as each layer's slice of ``grad`` is final
        (last layer first). ``x`` may be a dense array or a scipy CSR matrix.
        """
        acts, probs = self.forward(x)
        loss, delta = output_delta(probs, y, scale)
        layers = self.layers(self.params)
        grads = self.layers(grad)
        for i in range(len(layers) - 1, -1, -1):
            gw, gb = grads[i]
            h = acts[i]
            gw[...] = h.T @ delta
            gb[...] = delta.sum(axis=0)
            if on_ready is not None:
                w_slice, b_slice = self.slices[i]
                on_ready(w_slice.start, b_slice.stop)
            if i:
                delta = (delta @ layers[i][0].T) * (1.0 - acts[i] ** 2)
        return loss

    def accuracy(self, x: Any, y: np.ndarray) -> float:
        """Share of rows whose most probable class is ``y``."""
        _, probs = self.forward(x)
        return float((probs.argmax(axis=1) == y).mean())


def output_delta(probs: np.ndarray, y: np.ndarray, scale: float) -> tuple[float, np.ndarray]:
    """Summed cross-entropy of ``probs`` against ``y``, and its scaled output gradient.

    The gradient is ``scale x`` d(loss)/d(softmax inputs); ``probs`` is overwritten with it.
    """
    rows = np.arange(probs.shape[0])
    loss = -float(np.log(np.maximum(probs[rows, y], 1e-300)).sum())
    probs[rows, y] -= 1.0
    probs *= scale
    return loss, probs


MODELS = ("softmax", "mlp", "mlp2", "mlp4")


def make_model(
    name: str, n_features: int, n_classes: int, hidden: int = 64, seed: int = 0
) -> Model:
    """A model by name: ``softmax``, ``mlp``, ``mlp2`` or ``mlp4``.

    ``softmax`` has no hidden layer; ``mlp`` one, ``mlp2`` two and ``mlp4`` four hidden
    layers of ``hidden`` units.

    Raises:
        SgdError: an unknown model name.
    """
    if name == "softmax":
        return Model([n_features, n_classes], seed)
    if name == "mlp":
        return Model([n_features, hidden, n_classes], seed)
    if name in ("mlp2", "mlp4"):
        return Model([n_features, *[hidden] * int(name[-1]), n_classes], seed)
    raise SgdError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
