"""``hpcpar bench codecs``: the compression coders against a memory copy of the same bytes.

Each variant codes a float32 vector and decodes it again (what one coding costs a
compressed allreduce; ``int8-feedback`` also adds the vector to the residual first, as
error feedback does); the peer, ``memcpy``, copies the same vector once
(``numpy.copyto``). A variant at ``vs_peer`` 2.0 codes and decodes at half the copy's
speed. Every rank times its own core; run it on one rank for one core's figure.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from ..cli.common import integer
from ..plugins import Benchmark, register
from .harness import Variant, run_sweep

__all__: list[str] = []

_VARIANTS = ("fp16", "bf16", "int8", "int8-stochastic", "1bit", "int8-feedback")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--block", type=integer(1, 1 << 30), default=None, help="elements per block (default 256)"
    )


def _copy_case() -> Callable[[int], Any]:
    def make(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        x = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
        out = np.empty_like(x)
        return (lambda: np.copyto(out, x)), (lambda: np.array_equal(out, x))

    return make


def _codec_case(name: str, block: int) -> Callable[[int], Any]:
    from ..collectives.compression import codec_for

    scheme, _, mode = name.partition("-")
    codec = codec_for(scheme, block, "stochastic" if mode == "stochastic" else "nearest")
    feedback = mode == "feedback"
    eps = codec.scheme.eps_stochastic if codec.stochastic else codec.scheme.eps

    def make(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        x = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
        work = np.zeros_like(x) if feedback else x
        payload = np.empty(codec.wire_bytes(x.size), np.uint8)
        out = np.empty_like(x)

        def run() -> None:
            if feedback:  # as in an allreduce: the residual joins the contribution
                np.add(work, x, out=work)
            codec.encode(work, payload, feedback=feedback)
            codec.decode(payload, out, add=False)

        def check() -> bool:
            fresh = np.empty_like(payload)
            codec.encode(x.copy(), fresh)
            got = np.empty_like(x)
            codec.decode(fresh, got, add=False)
            return bool(np.all(np.abs(got - x) <= (eps + 2.0**-20) * np.abs(x).max()))

        return run, check

    return make


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:
    from ..collectives.compression import DEFAULT_BLOCK

    block = args.block or DEFAULT_BLOCK
    variants = [Variant("memcpy", _copy_case())]
    variants += [Variant(name, _codec_case(name, block)) for name in _VARIANTS]
    return run_sweep(comm, args, variants, title=f"codecs (float32, blocks of {block})", unit=4)


register(
    Benchmark(
        "codecs",
        "compression coders (code + decode) against a memory copy of the same bytes",
        _add_arguments,
        _run,
        peer="memcpy",
    )
)
