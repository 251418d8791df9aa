"""One job at a time in a checkpoint directory: an advisory lock held by rank 0.

Two jobs saving into one directory would each commit versions the other prunes or
overwrites. The ``Checkpointer`` takes ``flock`` on ``hpcpar-checkpoint.lock`` for as long
as it is open, and writes who holds it (host, process, Slurm job, since when) into the
file, so a second job is refused with a message naming the first. The kernel releases
the lock when its process dies, so a crashed job never leaves a stale lock. On a file
system without ``flock`` support the directory is used unlocked, with a warning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
import warnings
from pathlib import Path

from .state import CheckpointError

__all__ = ["DirectoryLock", "LOCK_FILE"]

LOCK_FILE = "hpcpar-checkpoint.lock"
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _holder() -> dict[str, object]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job": os.environ.get("SLURM_JOB_ID", ""),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _describe(text: str) -> str:
    try:
        doc = json.loads(text)
        where = f"process {doc['pid']} on {doc['host']}"
        job = f", Slurm job {doc['job']}" if doc.get("job") else ""
        return f"{where}{job}, since {doc['since']}"
    except (ValueError, KeyError, TypeError):
        return "another process"


class DirectoryLock:
    """The exclusive lock of a checkpoint directory (take it on one rank only).

    Raises:
        CheckpointError: another process holds it (the message names the holder), or
            the lock file cannot be created.
    """

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / LOCK_FILE
        try:
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CheckpointError(f"cannot create {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(self._fd, 4096, 0).decode(errors="replace"))
            self.release()
            raise CheckpointError(
                f"checkpoint directory {root} is in use by {holder}; one job at a time "
                "may save into a directory (wait for it, or use another directory)"
            ) from None
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                self.release()
                raise CheckpointError(f"cannot lock {self.path}: {exc.strerror or exc}") from None
            warnings.warn(
                f"hpcpar: {self.path.parent} does not support file locks; it is used "
                "unlocked (make sure no other job saves into it)",
                RuntimeWarning,
                stacklevel=2,
            )
        with contextlib.suppress(OSError):  # who holds it is information, not the lock
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, json.dumps(_holder()).encode(), 0)

    def release(self) -> None:
        """Give the lock up (closing the file releases it)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
