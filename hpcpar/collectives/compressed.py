"""What a ``compression=`` call of ``hpcpar.allreduce`` runs: its checks and its codec.

The schemes and the schedule are in ``hpcpar.collectives.compression``, their place in
the cost model in ``hpcpar.collectives.cost.compressed``; this module decides, for one
call, whether it can be compressed and with which codec (None: the exact call).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import CollectiveError
from .ops import ReduceOp
from .state import state_for

__all__ = ["check_compressible", "codec_for_call"]


def check_compressible(data: np.ndarray, rop: ReduceOp, algorithm: str, reproducible: bool) -> None:
    """Raise unless a call with these arguments can be compressed."""
    if data.dtype not in (np.float32, np.float64):
        raise CollectiveError(
            f"allreduce: compression applies to float32 and float64 data, not {data.dtype}"
        )
    if rop.name != "SUM" or rop.mpi_op is None:
        raise CollectiveError(f"allreduce: compression applies to op SUM only, not {rop.name}")
    if reproducible:
        raise CollectiveError("allreduce: reproducible=True and compression= cannot be combined")
    if algorithm != "auto":
        raise CollectiveError(
            "allreduce: compression= runs its own schedule; leave algorithm='auto'"
        )


def codec_for_call(
    data: np.ndarray, rop: ReduceOp, comm: Any, algorithm: str, reproducible: bool, spec: Any
) -> tuple[Any, tuple[Any, str] | None]:
    """The codec a compressed call runs (None: exact) and the record to run it as."""
    check_compressible(data, rop, algorithm, reproducible)
    from .compression.allreduce import record_for
    from .cost.explain import scheme_for_call

    name, reason = scheme_for_call(spec, state_for(comm), data.size, data.itemsize)
    if name == "exact":
        return None, None
    codec = spec.codec(name)
    return codec, (record_for(codec), reason)
