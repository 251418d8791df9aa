"""hpcpar.checkpoint: asynchronous multi-level checkpointing (installed from checkpoint/).

The Checkpointer and its levels arrive with the checkpointing issue; this package exists
now so the install layout (``checkpoint/`` installed as ``hpcpar.checkpoint``) is fixed
and tested from the start.
"""

from __future__ import annotations

__all__: list[str] = []
