"""Options and helpers shared by several subcommands."""

from __future__ import annotations

import argparse

__all__ = ["add_layout_argument"]


def add_layout_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--layout`` (a virtual node layout; default: HPCPAR_LAYOUT or the real nodes)."""
    parser.add_argument(
        "--layout",
        default=None,
        metavar="L",
        help="virtual node layout: ppn:K, nodes:A,B,... or roundrobin:K "
        "(default: $HPCPAR_LAYOUT, else the real nodes)",
    )
