"""Derived datatypes: canonical strided-block plans from MPI datatypes and array views."""

from __future__ import annotations

from .errors import DatatypeError
from .plan import Plan, plan

__all__ = ["Plan", "plan", "DatatypeError"]
