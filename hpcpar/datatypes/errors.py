"""Errors of the datatypes layer."""

from __future__ import annotations

from ..errors import HpcparError

__all__ = ["DatatypeError"]


class DatatypeError(HpcparError):
    """A datatype, view or buffer that a plan cannot describe or safely use."""
