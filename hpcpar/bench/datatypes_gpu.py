"""``hpcpar bench datatypes --gpu``: the GPU cases (cupy arrays), against cupy's own copies.

The faces and the interior of an N^3 cupy array (``hpcpar-device``, ``hpcpar-staged``
and the device unpack against ``cupy.ascontiguousarray``, ``view.get()`` and cupy's
strided assignment) and the irregular case of 4,096 scattered 8 B blocks (one
``block_copy`` launch against ``cupy.take`` and indexed assignment); see
``bench/datatypes.py`` for the command. Imported only with ``--gpu``.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .datatype_cases import Gather, cases, measure_case
from .harness import Variant

__all__ = ["gpu_cases"]


_GPU_CASES: list[tuple[str, Callable[[Any], Any]]] = [
    ("x face (contiguous plane)", lambda a: a[0]),
    ("y face (rows of N doubles)", lambda a: a[:, 0, :]),
    ("z face (single doubles)", lambda a: a[:, :, 0]),
    ("interior (N-2)^3", lambda a: a[1:-1, 1:-1, 1:-1]),
]


def _synced(stream: Any, run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` followed by a synchronisation of ``stream`` (each GPU variant's call)."""

    def call() -> Any:
        result = run()
        stream.synchronize()
        return result

    return call


def _gpu_variants(whole: np.ndarray, index: Callable[[Any], Any]) -> list[Variant]:
    """GPU variants for one view (``index`` of the whole array), on a device copy."""
    import cupy

    from ..datatypes.gpu import device_to_host, device_view, pack_device, unpack_device

    view = index(whole)
    device_whole = cupy.asarray(whole)
    device = index(device_whole)
    stream = cupy.cuda.get_current_stream()
    reference = np.ascontiguousarray(view).reshape(-1).view(np.uint8)
    p, area, origin = device_view(device)

    synced = functools.partial(_synced, stream)

    def on_host(result: Any) -> np.ndarray:
        host = result if isinstance(result, np.ndarray) else cupy.asnumpy(result)
        return np.ascontiguousarray(host).reshape(-1).view(np.uint8)

    def variant(name: str, run: Callable[[], Any]) -> Variant:
        def make(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
            return synced(run), (lambda: np.array_equal(on_host(run()), reference))

        return Variant(name, make)

    packed = pack_device(p, area, origin=origin)
    scratch = cupy.zeros_like(device_whole)
    target = index(scratch)
    typed = packed.view(device.dtype).reshape(device.shape)

    def unpack_check(run: Callable[[], Any]) -> Callable[[int], Any]:
        def make(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
            def check() -> bool:
                scratch.fill(0)
                run()
                return bool(cupy.asnumpy(target).tobytes() == reference.tobytes())

            return synced(run), check

        return make

    _, scratch_area, scratch_origin = device_view(target)
    return [
        variant("hpcpar-device", lambda: pack_device(p, area, origin=origin)),
        variant("cupy-contiguous", lambda: cupy.ascontiguousarray(device)),
        variant("hpcpar-staged", lambda: device_to_host(device, "staged")),
        variant("cupy-get", device.get),
        Variant(
            "hpcpar-device-unpack",
            unpack_check(lambda: unpack_device(p, packed, scratch_area, origin=scratch_origin)),
        ),
        Variant("cupy-unpack", unpack_check(lambda: target.__setitem__(Ellipsis, typed))),
    ]


def _gpu_irregular_variants(whole: np.ndarray, gather: Gather, dt: Any) -> list[Variant]:
    """GPU variants for an irregular layout, on a device copy of ``whole``.

    hpcpar's one-launch block copy against cupy's ``take`` and indexed assignment of the
    doubles at a precomputed index (the peer), both checked against MPI's packed bytes.
    """
    import cupy
    from mpi4py import MPI

    from ..datatypes import plan
    from ..datatypes.gpu import pack_device, unpack_device

    p = plan(dt)
    device_whole = cupy.asarray(whole)
    area = device_whole.reshape(-1).view(cupy.uint8)
    index = cupy.asarray(gather.index)
    reference = np.empty(p.size, np.uint8)
    dt.Pack(whole.reshape(-1).view(np.uint8), reference, 0, MPI.COMM_SELF)
    stream = cupy.cuda.get_current_stream()
    packed = cupy.asarray(reference)
    doubles = packed.view(whole.dtype)
    scratch = cupy.zeros_like(device_whole)
    scratch_area = scratch.reshape(-1).view(cupy.uint8)

    synced = functools.partial(_synced, stream)

    def pack(run: Callable[[], Any]) -> Callable[[int], Any]:
        def make(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
            check = lambda: cupy.asnumpy(run()).reshape(-1).view(np.uint8).tobytes()  # noqa: E731
            return synced(run), (lambda: check() == reference.tobytes())

        return make

    def unpack(run: Callable[[], Any]) -> Callable[[int], Any]:
        def make(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
            def check() -> bool:
                scratch.fill(0)
                run()
                got = cupy.asnumpy(scratch).reshape(-1)
                return bool(np.array_equal(got[gather.index], whole.reshape(-1)[gather.index]))

            return synced(run), check

        return make

    return [
        Variant("hpcpar-device", pack(lambda: pack_device(p, area))),
        Variant("cupy-take", pack(lambda: cupy.take(device_whole, index))),
        Variant("hpcpar-device-unpack", unpack(lambda: unpack_device(p, packed, scratch_area))),
        Variant("cupy-put", unpack(lambda: scratch.reshape(-1).__setitem__(index, doubles))),
    ]


def gpu_cases(comm: Any, args: argparse.Namespace, say: Callable[..., Any]) -> list[Any]:
    """The GPU cases: faces and interior of an N^3 cupy array, and an irregular layout."""
    results = []
    whole = np.random.default_rng(0).random((args.n, args.n, args.n))
    for name, index in _GPU_CASES:
        variants = _gpu_variants(whole, index)
        case = (f"GPU {name}", f"GPU {name}")
        results += measure_case(
            comm, args, say, case, variants, index(whole).nbytes, "cupy-contiguous"
        )
    for name, make in cases(
        args.n, args.large
    ):  # the smallest irregular case (the kernel: one launch)
        if name.startswith("indexed: 4096 blocks of 8 B"):
            raw, (gather, dt) = make()
            variants = _gpu_irregular_variants(raw, gather, dt)
            case = (f"GPU {name}", f"GPU {name}")
            results += measure_case(comm, args, say, case, variants, dt.Get_size(), "cupy-take")
            dt.Free()
    return results
