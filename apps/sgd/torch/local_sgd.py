"""Local SGD and DiLoCo-style outer steps over a ``DataParallel`` model."""

from __future__ import annotations

from typing import Any

import torch

from hpcpar.gradients import as_array

from ..models import SgdError
from .data_parallel import DataParallel

__all__ = ["LocalSGD"]


class LocalSGD:
    """Local SGD and DiLoCo-style outer steps over a ``DataParallel`` model.

    Each rank takes ``steps`` steps of its own (inner) optimizer on its own batches
    without communication; then the ranks average how far their models moved from the
    last common model (the outer gradient, one allreduce) and an outer optimizer steps
    the common model by it, and every rank continues from the result. Communication
    falls by a factor of ``steps``. With the default outer optimizer (SGD, learning rate
    1) the outer step is plain model averaging (local SGD); DiLoCo uses SGD with
    Nesterov momentum (``lambda p: torch.optim.SGD(p, lr=0.7, momentum=0.9,
    nesterov=True)``).

    Args:
        model: The ``DataParallel`` model (all parameters of one dtype and device).
        inner: The inner optimizer over ``model.parameters()``.
        steps: Inner steps per outer step.
        make_outer: Builds the outer optimizer from a list of parameters (default: SGD
            with learning rate 1).

    Raises:
        SgdError: ``steps`` below 1, or parameters of several dtypes or devices.
    """

    def __init__(
        self, model: DataParallel, inner: Any, *, steps: int = 8, make_outer: Any = None
    ) -> None:
        if not isinstance(steps, int) or steps < 1:
            raise SgdError(f"LocalSGD: steps must be a positive integer, not {steps!r}")
        self.model, self.inner, self.steps = model, inner, steps
        self.params = [p for p in model.module.parameters() if p.requires_grad]
        if len({(p.dtype, p.device) for p in self.params}) != 1:
            raise SgdError("LocalSGD: the parameters must share one dtype and device")
        model.sync_gradients = False  # the inner steps use each rank's own gradients
        with torch.no_grad():
            self.common = torch.nn.Parameter(self._flat())
        make_outer = make_outer or (lambda p: torch.optim.SGD(p, lr=1.0))
        self.outer = make_outer([self.common])
        self.taken = 0  # inner steps since the last outer step

    def _flat(self) -> Any:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients (the inner optimizer's)."""
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self) -> bool:
        """One inner step, and the outer step when ``steps`` have been taken.

        Returns:
            Whether this step synchronised the ranks (collective then).
        """
        self.inner.step()
        self.taken += 1
        if self.taken < self.steps:
            return False
        self.synchronize()
        return True

    def synchronize(self) -> None:
        """The outer step now (collective): average the moves, step the common model."""
        import hpcpar

        model = self.model
        with torch.no_grad():
            moved = self.common.detach() - self._flat()
            total = hpcpar.allreduce(
                as_array(moved), comm=model.hierarchy, algorithm=model.algorithm
            )
            self.common.grad = torch.as_tensor(total, device=moved.device).div_(model.size)
        self.outer.step()
        with torch.no_grad():
            at = 0
            for p in self.params:
                n = p.numel()
                p.copy_(self.common[at : at + n].view_as(p))
                at += n
        self.taken = 0
