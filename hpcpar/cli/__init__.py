"""The ``hpcpar`` command line: one entry point (``main``) over the registered commands.

Commands, benchmarks and demo steps are registered in ``hpcpar.plugins``.
"""

from __future__ import annotations

__all__: list[str] = []
