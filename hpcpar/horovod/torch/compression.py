"""Horovod's ``Compression``: what an allreduce sends (``none``, or ``fp16``)."""

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


class Compression:
    """Optional compression of the tensors an allreduce sends: ``none`` or ``fp16``."""

    none = _NoneCompressor
    fp16 = _FP16Compressor
