"""``hpcpar info``: which MPI, Python stack, GPU and topology this job runs on."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..plugins import Command, register
from ..runtime.settings import lookup, unknown
from .common import add_layout_argument

__all__ = ["collect_info", "format_info"]


def _h5py_info() -> str:
    try:
        import h5py
    except ImportError:
        return "not installed"
    mpi = "with MPI (parallel HDF5)" if h5py.get_config().mpi else "without MPI (serial HDF5)"
    return f"{h5py.__version__}, built {mpi}, HDF5 {h5py.version.hdf5_version}"


def _gpu_info() -> str:
    try:
        import cupy
    except ImportError:
        return "cupy not installed; no GPU buffers"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device: cupy raises its own CUDA errors
        return f"cupy {cupy.__version__}, no usable GPU ({type(exc).__name__})"
    names = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(count)]
    return f"cupy {cupy.__version__}, {count} GPU(s): {', '.join(names) or 'none'}"


def collect_info(comm: Any) -> dict[str, str]:
    """Return the facts ``hpcpar info`` prints, as an ordered name -> value dict."""
    import mpi4py
    import numpy
    from mpi4py import MPI

    from .._version import __version__
    from ..runtime.mpiinfo import find_mpi
    from ..runtime.results import git_commit

    mpi = find_mpi()
    threads = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    major, minor = MPI.Get_version()
    settings = {k: v for k, v in sorted(os.environ.items()) if lookup(k) is not None}
    strays = unknown()
    return {
        "hpcpar": f"{__version__} (git {git_commit() or 'unknown'})",
        "MPI library": mpi.version,
        "MPI vendor": mpi.vendor,
        "MPI standard": f"{major}.{minor}",
        "libmpi": mpi.libmpi or "unknown",
        "mpiexec": f"{mpi.mpiexec or 'not found'} ({mpi.mpiexec_source})",
        "thread level": threads.get(MPI.Query_thread(), str(MPI.Query_thread())),
        "mpi4py": mpi4py.__version__,
        "numpy": numpy.__version__,
        "h5py": _h5py_info(),
        "GPU": _gpu_info(),
        "ranks": str(comm.Get_size()),
        "HPCPAR_ settings": ", ".join(f"{k}={v}" for k, v in settings.items()) or "none",
        **(
            {"unknown HPCPAR_ names": ", ".join(strays) + " (no such setting: a typo?)"}
            if strays
            else {}
        ),
    }


def format_info(info: dict[str, str]) -> str:
    """Align ``name: value`` lines."""
    width = max(len(k) for k in info)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in info.items())


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_layout_argument(parser)


def _run(comm: Any, args: argparse.Namespace) -> int:
    from ..topology import Hierarchy

    info = collect_info(comm)
    with Hierarchy(comm, layout=args.layout) as hierarchy:
        table = hierarchy.describe()
    if comm.Get_rank() == 0:
        print(format_info(info))
        print()
        print(table, flush=True)
    return 0


register(
    Command("info", "show the MPI library, Python stack, GPU and topology", _add_arguments, _run)
)
