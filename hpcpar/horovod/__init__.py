"""Horovod's APIs over hpcpar: ``import hpcpar.horovod.torch as hvd``.

A training script written for Horovod runs on hpcpar's collectives with its import line
changed; see ``hpcpar.horovod.torch`` and docs/horovod.md. A script's ``import
horovod`` (for ``horovod.run``) becomes ``import hpcpar.horovod as horovod``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run"]


def run(func: Any, *args: Any, **kwargs: Any) -> Any:
    """Horovod's in-process launcher, which hpcpar does not offer (one-line error).

    Start the script with ``hpcpar horovodrun -np N python script.py`` (or ``hpcpar
    launch``) instead: its ranks are started by MPI, not by the script.
    """
    raise NotImplementedError(
        "horovod.run is not offered by hpcpar.horovod: start the script with "
        "hpcpar horovodrun -np N python SCRIPT (or hpcpar launch -n N -- python SCRIPT)"
    )
