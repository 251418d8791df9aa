"""Compressed collectives: lossy sums for slow links, opt-in, coded only across nodes.

``hpcpar.allreduce(x, compression="int8")`` (or ``"fp16"``, ``"bf16"``, ``"1bit"``, a
``Compression`` with a block size and rounding, or ``"auto"`` with ``tolerance=``) sums
float32/float64 data exactly inside each node and codes only what crosses between
nodes (``allreduce``); on one node nothing is coded. ``schemes`` describes each scheme
and its error bound, ``kernels`` holds the compiled coders (the cost model's view is
``hpcpar.collectives.cost.compressed``; ``explain`` ranks the schemes), and
``feedback=`` takes an error-feedback object (``hpcpar.ErrorFeedback``) so that
repeated calls lose nothing on average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import CollectiveError
from .schemes import DEFAULT_BLOCK, ROUNDINGS, SCHEMES, Codec, Scheme, codec_for

__all__ = [
    "Compression",
    "as_compression",
    "Codec",
    "Scheme",
    "SCHEMES",
    "DEFAULT_BLOCK",
    "codec_for",
]


@dataclass(frozen=True)
class Compression:
    """What a compressed collective codes with.

    Attributes:
        scheme: ``"fp16"``, ``"bf16"``, ``"int8"``, ``"1bit"`` or ``"auto"``.
        block: Elements per block (one scale each; a multiple of 8 for ``1bit``).
        rounding: ``"nearest"`` or (int8) ``"stochastic"``.
        tolerance: The largest error bound the caller accepts (required by ``auto``,
            which then picks the fastest predicted scheme within it, or exact); with a
            named scheme, a bound over it is an error.
        seed: Stochastic rounding's seed.
    """

    scheme: str = "auto"
    block: int = DEFAULT_BLOCK
    rounding: str = "nearest"
    tolerance: float | None = None
    seed: int = 0

    def codec(self, scheme: str | None = None) -> Codec:
        """The codec of ``scheme`` (default: this one's) with this block and rounding."""
        name = scheme or self.scheme
        return codec_for(name, self.block, self.rounding if name == "int8" else "nearest")


def _check_tolerance(tol: object) -> None:
    if tol is not None and (
        isinstance(tol, bool)
        or not isinstance(tol, (int, float))
        or not math.isfinite(tol)
        or tol <= 0
    ):
        raise CollectiveError(f"tolerance must be a finite number > 0, not {tol!r}")


def _spec(value: object) -> Compression:
    if isinstance(value, str):
        return Compression(value)
    if isinstance(value, Compression):
        return value
    raise CollectiveError(
        f"compression must be None, a scheme name or a Compression, not {type(value).__name__}"
    )


def as_compression(value: object, tolerance: object = None) -> Compression | None:
    """Turn ``compression=`` (and ``tolerance=``) into a checked ``Compression``, or None.

    Raises:
        CollectiveError: an unknown scheme, block size or rounding, a tolerance that is
            not a positive number, ``auto`` without one, or a tolerance without a scheme.
    """
    if value is None:
        if tolerance is not None:
            raise CollectiveError("tolerance= applies to compressed calls: pass compression=")
        return None
    spec = _spec(value)
    if tolerance is not None:
        spec = Compression(spec.scheme, spec.block, spec.rounding, tolerance, spec.seed)  # type: ignore[arg-type]
    tol = spec.tolerance
    _check_tolerance(tol)
    if spec.rounding not in ROUNDINGS:
        raise CollectiveError(f"rounding must be 'nearest' or 'stochastic', not {spec.rounding!r}")
    if spec.rounding == "stochastic" and spec.scheme not in ("int8", "auto"):
        raise CollectiveError(f"stochastic rounding applies to int8 only, not {spec.scheme}")
    if spec.scheme == "auto":
        if tol is None:
            raise CollectiveError(
                "compression='auto' needs tolerance= (the largest error bound to accept)"
            )
        codec_for("int8", spec.block, spec.rounding)  # checks the block size
    else:
        spec.codec()  # checks scheme, block size and rounding
    if not isinstance(spec.seed, (int, np.integer)):
        raise CollectiveError(f"compression seed must be an integer, not {spec.seed!r}")
    return spec
