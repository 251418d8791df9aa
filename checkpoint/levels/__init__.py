"""Checkpoint levels: where a version's shards are kept, fastest first."""

from __future__ import annotations

from .base import Job, Level
from .hdf5 import Hdf5Level
from .local import LocalLevel
from .partner import PartnerLevel
from .xor import XorLevel

__all__ = ["Job", "Level", "LocalLevel", "PartnerLevel", "XorLevel", "Hdf5Level"]
