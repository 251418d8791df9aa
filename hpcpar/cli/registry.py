"""The registry of ``hpcpar`` subcommands.

A subcommand is ``(name, add_arguments, run(comm, args))``. Modules register theirs at
import time and must stay light to import: MPI and heavy libraries are imported inside
``run``, because the registry is filled before the CLI decides whether this process
becomes an MPI rank (``launch`` must not).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Command", "register", "commands", "BUILTIN_MODULES"]

# Modules that define the built-in subcommands, in the order --help lists them.
BUILTIN_MODULES = (
    "hpcpar.cli.info",
    "hpcpar.cli.demo",
    "hpcpar.cli.launch",
    "hpcpar.cli.explain",
    "hpcpar.cli.calibrate",
    "hpcpar.cli.simulate",
    "hpcpar.cli.vcluster",
    "hpcpar.cli.checkpoint",
    "hpcpar.cli.jobs",
    "hpcpar.cli.experiment",
    "hpcpar.apps.cfr.cli",
    "hpcpar.apps.sgd.cli",
    "hpcpar.apps.sat.cli",
    "hpcpar.apps.graph.cli",
    "hpcpar.bench.command",
)


@dataclass(frozen=True)
class Command:
    """One ``hpcpar`` subcommand.

    Attributes:
        name: What the user types.
        help: One line for ``hpcpar --help``.
        add_arguments: Adds the subcommand's options to its parser.
        run: ``run(comm, args)``; returns an exit status (``None`` means 0). ``comm``
            is hpcpar's default communicator, or ``None`` when ``needs_mpi`` is false.
        needs_mpi: False for commands that must not become MPI ranks (``launch``).
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Any, argparse.Namespace], int | None]
    needs_mpi: bool = True


_COMMANDS: dict[str, Command] = {}
_loaded = False


def register(command: Command) -> Command:
    """Add a subcommand to the registry (a later registration of a name replaces it)."""
    _COMMANDS[command.name] = command
    return command


def commands() -> dict[str, Command]:
    """Return every registered subcommand, importing the built-in ones on first call."""
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
    return dict(_COMMANDS)
