"""Plots from results, as PNG files: matplotlib when it is installed, nothing otherwise.

Plots are drawn from the figures a command has already written, never during the timed
part; matplotlib is optional (``pip install 'hpcpar[plot]'``), so every plot is skipped
quietly without it, and with ``HPCPAR_PLOTS=0``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .settings import flag

__all__ = ["pyplot", "save", "MISSING"]

MISSING = "matplotlib is not installed, so no PNG (pip install 'hpcpar[plot]')"


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` with a non-interactive backend, or None.

    None without matplotlib, or with ``HPCPAR_PLOTS=0``.
    """
    if not flag("HPCPAR_PLOTS"):
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Lay ``fig`` out, write it to ``path`` and release it; returns the path.

    Where the decorations do not fit the figure's size (a long title, many legend
    entries) the saved image grows to hold them instead.
    """
    import warnings

    import matplotlib.pyplot as plt

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Tight layout not applied", UserWarning)
        fig.tight_layout()
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return Path(path)
