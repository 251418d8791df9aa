"""hpcpar.apps: the applications built on hpcpar (installed from apps/).

Each app (sgd, cfr, graph, sat) is a subpackage with its engine, CLI subcommand,
checkpointing and benchmark; they arrive with their issues.
"""

from __future__ import annotations

__all__: list[str] = []
