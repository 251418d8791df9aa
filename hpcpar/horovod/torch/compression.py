"""Horovod's ``Compression``: what an allreduce sends (``none``, or ``fp16``), and hpcpar's.

``Compression.bf16``, ``Compression.int8`` and ``Compression.onebit`` are hpcpar's
compressed allreduce (``hpcpar.collectives.compression``) for ``DistributedOptimizer``'s
gradient buckets: coded only across nodes, int8 and 1bit with error feedback. The
tensors themselves are not changed (their ``compress`` is the identity).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compression"]


class _NoneCompressor:
    """No compression."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor as it is."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The tensor as it is."""
        return tensor


class _FP16Compressor:
    """Floating-point tensors sent as float16 and restored to their dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``tensor`` as float16 when it is floating point; its dtype as the context."""
        dtype = tensor.dtype
        return (tensor.type(torch.float16) if dtype.is_floating_point else tensor), dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Back to the original dtype."""
        return tensor.type(ctx) if ctx.is_floating_point else tensor


class _CodedCompressor(_NoneCompressor):
    """A compressed allreduce of the gradient buckets (``scheme``), exact inside a node."""

    name = ""  # its name in ``Compression``
    scheme = ""
    error_feedback = False


def _coded(name: str, scheme: str, feedback: bool) -> type:
    doc = f"Gradient buckets coded as {scheme} across nodes" + (
        ", with error feedback" if feedback else ""
    )
    return type(
        f"_{scheme.upper()}Compressor",
        (_CodedCompressor,),
        {"name": name, "scheme": scheme, "error_feedback": feedback, "__doc__": doc},
    )


class Compression:
    """Optional compression of the tensors an allreduce sends.

    Horovod's ``none`` and ``fp16``; hpcpar's ``bf16``, ``int8`` and ``onebit`` for
    ``DistributedOptimizer``.
    """

    none = _NoneCompressor
    fp16 = _FP16Compressor
    bf16 = _coded("bf16", "bf16", False)
    int8 = _coded("int8", "int8", True)
    onebit = _coded("onebit", "1bit", True)
