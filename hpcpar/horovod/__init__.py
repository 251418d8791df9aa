"""Horovod's APIs over hpcpar: ``import hpcpar.horovod.torch as hvd``.

A training script written for Horovod runs on hpcpar's collectives with its import line
changed; see ``hpcpar.horovod.torch`` and docs/horovod.md.
"""

__all__: list[str] = []
