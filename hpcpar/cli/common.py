"""Options and helpers shared by several subcommands: the layout option, checked numbers."""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["add_layout_argument", "integer", "real", "output_path", "output_folder", "MAX_INT"]

MAX_INT = (1 << 63) - 1


def _bounds(low: float | None, high: float | None) -> str:
    high = None if high == MAX_INT else high  # as good as unbounded, in words

    def show(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    if low is not None and high is not None:
        return f"from {show(low)} to {show(high)}"
    if low is not None:
        return f"of at least {show(low)}"
    return f"of at most {show(high)}" if high is not None else ""


def integer(low: int | None = 0, high: int | None = MAX_INT) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[low, high]`` (None: unbounded on that side)."""

    def parse(text: str) -> int:
        try:
            value = (
                int(text, 0) if text.strip().lower().startswith(("0x", "0o", "0b")) else int(text)
            )
        except ValueError:
            value = None
        if (
            value is None
            or (low is not None and value < low)
            or (high is not None and value > high)
        ):
            raise argparse.ArgumentTypeError(
                f"expected an integer {_bounds(low, high)}, not {text!r}"
            )
        return value

    parse.__name__ = "integer"
    return parse


def real(
    low: float | None = None,
    high: float | None = None,
    *,
    above: bool = False,
    infinite: bool = False,
) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[low, high]`` (``above``: ``> low``).

    ``infinite`` also allows ``inf`` (where it means "no limit"); NaN is never a value.
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = not math.isnan(value) and (math.isfinite(value) or (infinite and value > 0))
        if ok and low is not None:
            ok = value > low if above else value >= low
        if ok and high is not None:
            ok = value <= high
        if not ok:
            side = f"above {low:g}" if above and low is not None else _bounds(low, high)
            extra = " (or inf)" if infinite else ""
            raise argparse.ArgumentTypeError(f"expected a number {side}{extra}, not {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def add_layout_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--layout`` (a virtual node layout; default: HPCPAR_LAYOUT or the real nodes)."""
    parser.add_argument(
        "--layout",
        default=None,
        metavar="L",
        help="virtual node layout: ppn:K, nodes:A,B,... or roundrobin:K "
        "(default: $HPCPAR_LAYOUT, else the real nodes)",
    )


def checkpoint_levels(text: str) -> list[str]:
    """An argparse ``type``: comma-separated checkpoint level names (``memory,local,partner``)."""
    from ..checkpoint import CheckpointError
    from ..checkpoint.policy import check_levels

    try:
        return check_levels([name.strip() for name in text.split(",") if name.strip()])
    except CheckpointError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--checkpoint-levels`` and ``--checkpoint-local`` (the apps' ``Checkpointer``)."""
    parser.add_argument(
        "--checkpoint-levels",
        type=checkpoint_levels,
        default=["memory", "local"],
        metavar="LEVELS",
        help="checkpoint levels, comma-separated: memory, local, partner, xor, hdf5 "
        "(default: memory,local; partner or xor survive the loss of a node)",
    )
    parser.add_argument(
        "--checkpoint-local",
        default=None,
        metavar="DIR",
        help="node-local storage of the local, partner and xor levels, e.g. /dev/shm/ck "
        "(survives a killed process; default: the checkpoint directory's nodes/)",
    )


def output_path(text: str) -> str:
    """An argparse ``type``: a file hpcpar can create there (checked before any work starts).

    The folders on the way are created, and a temporary file is made and removed in the
    last of them, so a folder that cannot be created or written to (read-only, full, not
    a folder) is a usage error now, not a traceback after the work is done.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file name, not an empty one")
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".hpcpar-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise argparse.ArgumentTypeError(f"cannot create {text!r}: {reason}") from None
    return text


def output_folder(text: str) -> str:
    """An argparse ``type``: a folder hpcpar can write files in (made if missing).

    Like ``output_path`` for an option that names a folder: an existing file there, or
    a place where the folder cannot be made or written to, is a usage error at once.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder name, not an empty one")
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".hpcpar-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise argparse.ArgumentTypeError(f"cannot write in {text!r}: {reason}") from None
    return text
