"""What hpcpar's command line is made of: commands, benchmarks and demo steps, registered.

A module adds to the command line by calling ``register`` when it is imported, with a
``Command`` (an ``hpcpar`` subcommand), a ``Benchmark`` (``hpcpar bench NAME``) or a
``TourStep`` (a step of ``hpcpar demo``'s tour). The core's modules are listed in
``CORE_MODULES``; every other package, the apps among them, names its registering
modules in the entry-point group ``hpcpar.plugins``::

    [options.entry_points]
    hpcpar.plugins =
        myapp = mypackage.hpcpar_plugin

Registering modules must stay light to import: MPI and heavy libraries are imported
inside what runs, because the command line is built before the process decides whether
it becomes an MPI rank (``hpcpar launch`` must not).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

__all__ = [
    "Command",
    "Benchmark",
    "TourStep",
    "register",
    "commands",
    "benchmarks",
    "tour_steps",
    "CORE_MODULES",
    "ENTRY_POINTS",
]

ENTRY_POINTS = "hpcpar.plugins"

# The core's registering modules; ``hpcpar --help`` lists commands in this order.
CORE_MODULES = (
    "hpcpar.cli.info",
    "hpcpar.cli.demo",
    "hpcpar.cli.launch",
    "hpcpar.cli.horovodrun",
    "hpcpar.cli.explain",
    "hpcpar.cli.calibrate",
    "hpcpar.cli.simulate",
    "hpcpar.cli.vcluster",
    "hpcpar.cli.checkpoint",
    "hpcpar.cli.jobs",
    "hpcpar.cli.experiment",
    "hpcpar.cli.tour",
    "hpcpar.cli.trace",
    "hpcpar.bench.command",
    "hpcpar.bench.allreduce_mpi",
    "hpcpar.bench.collectives",
    "hpcpar.bench.codecs",
    "hpcpar.bench.recovery",
    "hpcpar.bench.datatypes",
    "hpcpar.bench.checkpoint",
    "hpcpar.bench.flight",
    "hpcpar.bench.soak",
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


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: ``hpcpar bench NAME``.

    Attributes:
        name: What the user types.
        help: One line for ``hpcpar bench --help``.
        add_arguments: Adds its own options (the shared ones are added for it).
        run: ``run(comm, args)`` returning a list of ``Measurement``.
        peer: The variant every other variant is compared against.
        bus_factor: ``f(ranks)`` turning algorithm bandwidth into bus bandwidth (NCCL's
            convention), or ``None`` where bus bandwidth means nothing.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Any, argparse.Namespace], list[Any]]
    peer: str
    bus_factor: Callable[[int], float] | None = None


@dataclass(frozen=True)
class TourStep:
    """One step of ``hpcpar demo``'s tour.

    Attributes:
        name: Its name in the summary table.
        order: Steps run in increasing order.
        run: ``run(comm, hierarchy, folder, say)`` (collective) returning a
            ``hpcpar.cli.tour.Step``; its files go under ``folder``.
    """

    name: str
    order: int
    run: Callable[[Any, Any, Any, Callable[..., None]], Any]


T = TypeVar("T", Command, Benchmark, TourStep)


class _Registry(Generic[T]):
    """Registered items of one kind by name (a later registration of a name replaces it)."""

    def __init__(self) -> None:
        self.items: dict[str, T] = {}

    def all(self) -> dict[str, T]:
        _load()
        return dict(self.items)


_REGISTRIES: dict[type, _Registry[Any]] = {
    Command: _Registry[Command](),
    Benchmark: _Registry[Benchmark](),
    TourStep: _Registry[TourStep](),
}
_loaded = False


def register(item: T) -> T:
    """Add a command, benchmark or tour step; returns it."""
    registry = _REGISTRIES.get(type(item))
    if registry is None:
        kind = type(item).__name__
        raise TypeError(f"cannot register a {kind}: only a Command, Benchmark or TourStep")
    registry.items[item.name] = item
    return item


def commands() -> dict[str, Command]:
    """Every ``hpcpar`` subcommand, core first."""
    return _REGISTRIES[Command].all()


def benchmarks() -> dict[str, Benchmark]:
    """Every benchmark of ``hpcpar bench``."""
    return _REGISTRIES[Benchmark].all()


def tour_steps() -> list[TourStep]:
    """The demo's tour, in order."""
    return sorted(_REGISTRIES[TourStep].all().values(), key=lambda step: step.order)


def _load() -> None:
    """Import the core's registering modules, then every entry point's (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in CORE_MODULES:
        importlib.import_module(module)
    for entry in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        try:
            entry.load()
        except Exception as exc:  # one broken package must not take the command line down
            sys.stderr.write(
                f"hpcpar: plugin {entry.name!r} ({entry.value}) failed to load: "
                f"{type(exc).__name__}: {exc}\n"
            )
