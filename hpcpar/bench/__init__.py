"""The one benchmark harness: OSU-style sweeps, validation, repeats, JSON/CSV output."""

from __future__ import annotations

from .harness import Measurement, Variant, format_size, parse_size, run_sweep, size_range, sweep
from .registry import Benchmark, benchmarks, register

__all__ = [
    "Benchmark",
    "benchmarks",
    "register",
    "Variant",
    "Measurement",
    "sweep",
    "run_sweep",
    "size_range",
    "parse_size",
    "format_size",
]
