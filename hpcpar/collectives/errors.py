"""Errors of the collectives layer."""

from __future__ import annotations

from ..errors import HpcparError

__all__ = ["CollectiveError", "CollectiveMismatchError"]


class CollectiveError(HpcparError):
    """A collective called wrongly: unknown algorithm, bad buffer, bad root or counts."""


class CollectiveMismatchError(CollectiveError):
    """Ranks called a collective with different arguments (found by ``HPCPAR_CHECK=1``)."""
