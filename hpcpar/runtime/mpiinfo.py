"""Which MPI library mpi4py loads, and the ``mpiexec`` that belongs to it.

Nothing here initialises MPI: the launcher calls it before any rank exists.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from . import settings

__all__ = ["MPIInstallation", "find_mpi", "vendor_of"]


@dataclass(frozen=True)
class MPIInstallation:
    """The MPI library mpi4py loaded and its launcher.

    Attributes:
        vendor: ``"mpich"``, ``"openmpi"``, ``"intel"``, ``"mvapich"`` or ``"other"``.
        version: First line of ``MPI_Get_library_version``.
        libmpi: Path of the loaded shared library, if it could be found.
        mpiexec: Path of the matching ``mpiexec``, if any.
        mpiexec_source: How ``mpiexec`` was chosen (next to the library, the Python
            prefix, ``HPCPAR_MPIEXEC``, or the first one on PATH).
    """

    vendor: str
    version: str
    libmpi: str | None
    mpiexec: str | None
    mpiexec_source: str


def vendor_of(version: str) -> str:
    """Classify an MPI library version string."""
    text = version.lower()
    for key, vendor in (
        ("open mpi", "openmpi"),
        ("intel", "intel"),
        ("mvapich", "mvapich"),
        ("mpich", "mpich"),
    ):
        if key in text:
            return vendor
    return "other"


def _loaded_libmpi() -> str | None:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                name = os.path.basename(path)
                if name.startswith(("libmpi.so", "libmpi_abi.so", "libmpich.so", "libmpi.")):
                    return path
    except OSError:
        pass
    return None


def _mpi_module():
    # Load libmpi without MPI_Init when nobody has imported mpi4py.MPI yet.
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
    from mpi4py import MPI

    return MPI


def _find_mpiexec(libmpi: str | None) -> tuple[str | None, str]:
    override = settings.value("HPCPAR_MPIEXEC")
    if override:
        return shutil.which(override) or override, "HPCPAR_MPIEXEC"
    candidates: list[tuple[Path, str]] = []
    if libmpi:
        candidates.append((Path(libmpi).resolve().parent.parent / "bin", "next to libmpi"))
    candidates.append((Path(sys.prefix) / "bin", "Python prefix"))
    for folder, source in candidates:
        for name in ("mpiexec", "mpirun"):
            exe = folder / name
            if exe.is_file() and os.access(exe, os.X_OK):
                return str(exe), source
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    return found, "PATH (could not match it to the loaded library)"


def find_mpi() -> MPIInstallation:
    """Describe the MPI library mpi4py loads and find its ``mpiexec``."""
    mpi = _mpi_module()
    version = " ".join(mpi.Get_library_version().strip().splitlines()[0].split())
    libmpi = _loaded_libmpi()
    mpiexec, source = _find_mpiexec(libmpi)
    return MPIInstallation(vendor_of(version), version, libmpi, mpiexec, source)
