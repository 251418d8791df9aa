"""Write faults armed for the current thread: what the shard writers check as they write.

``faults.Fault`` arms them for one level's write of one version on one rank; the
writers (``shard.write_file``, the HDF5 level) call ``check_write`` before the first
byte and ``at_half`` half way.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["arm", "disarm", "check_write", "at_half"]

_active = threading.local()


def arm(enospc: bool, die: Callable[[], None] | None) -> None:
    """Arm this thread's next shard write: ENOSPC at its start, or ``die()`` half way."""
    _active.enospc, _active.die = enospc, die


def disarm() -> None:
    """Clear this thread's armed write faults."""
    _active.enospc, _active.die = False, None


def check_write(path: Path) -> None:
    """Called at the start of every shard write: raise an armed ENOSPC."""
    if getattr(_active, "enospc", False):
        _active.enospc = False
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def at_half() -> None:
    """Called when half of a shard file is written: die if armed."""
    die = getattr(_active, "die", None)
    if die is not None:
        die()
