"""The one benchmark harness: OSU-style sweeps, validation, repeats, JSON/CSV output.

Benchmarks are registered as ``hpcpar.plugins.Benchmark``; ``hpcpar bench NAME`` runs
them (``command``).
"""

from __future__ import annotations

from .harness import Measurement, Variant, format_size, parse_size, run_sweep, size_range, sweep

__all__ = [
    "Variant",
    "Measurement",
    "sweep",
    "run_sweep",
    "size_range",
    "parse_size",
    "format_size",
]
