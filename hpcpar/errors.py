"""The error types hpcpar raises for user mistakes (one clear line each)."""

__all__ = [
    "HpcparError",
    "UsageError",
    "LayoutError",
    "LaunchError",
    "CommunicatorError",
]


class HpcparError(Exception):
    """A mistake by the user of hpcpar: the message alone says what is wrong.

    The command line prints it as one line on rank 0 and exits with status 2 on every
    rank, without a traceback.
    """


class UsageError(HpcparError):
    """A bad command line: unknown command, unknown flag or a malformed value."""


class LayoutError(HpcparError):
    """A virtual node layout that is malformed, or does not fit the job."""


class LaunchError(HpcparError):
    """A job that cannot be started: no launcher, missing script, bad rank count."""


class CommunicatorError(HpcparError):
    """A ``comm=`` argument that is not a usable intra-communicator."""
