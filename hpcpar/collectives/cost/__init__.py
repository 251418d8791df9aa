"""The cost model: exact message counts per algorithm, alpha-beta-gamma times, profiles."""

from __future__ import annotations

__all__: list[str] = []
