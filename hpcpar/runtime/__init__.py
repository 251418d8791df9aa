"""The runtime: default communicator, abort-on-error, logging and results files."""

from __future__ import annotations

__all__: list[str] = []
