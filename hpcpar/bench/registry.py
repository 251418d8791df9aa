"""The registry of benchmarks that ``hpcpar bench NAME`` runs."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Benchmark", "register", "benchmarks", "BUILTIN_MODULES"]

BUILTIN_MODULES = (
    "hpcpar.bench.allreduce_mpi",
    "hpcpar.bench.collectives",
    "hpcpar.bench.datatypes",
    "hpcpar.bench.checkpoint",
    "hpcpar.bench.cfr",
    "hpcpar.bench.sgd",
    "hpcpar.bench.sat",
    "hpcpar.bench.graph",
)


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


_BENCHMARKS: dict[str, Benchmark] = {}
_loaded = False


def register(benchmark: Benchmark) -> Benchmark:
    """Add a benchmark to the registry."""
    _BENCHMARKS[benchmark.name] = benchmark
    return benchmark


def benchmarks() -> dict[str, Benchmark]:
    """Return every registered benchmark, importing the built-in ones on first call."""
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
    return dict(_BENCHMARKS)
