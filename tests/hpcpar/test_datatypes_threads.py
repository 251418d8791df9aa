"""Large copies over threads: this rank's share of the cores and of the cache, and a
helper's failure reaching the caller (``datatypes/threads.py``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import hpcpar


@pytest.mark.parametrize(
    "src",
    [
        np.arange(3 * 2**18 + 5, dtype=np.int16),  # 1.5 MiB, not a multiple of the threads
        np.random.default_rng(1).random((512, 300)),  # 1.2 MiB, 2-D
        np.arange(2**21, dtype=np.float64).reshape(1024, 2048)[:, ::2],  # not contiguous
        np.arange(100, dtype=np.uint8),  # small: numpy's copy
    ],
)
def test_copy_array_copies_exactly(src):
    from hpcpar.datatypes.threads import copy_array

    dst = np.zeros_like(src)
    copy_array(dst, src)
    assert np.array_equal(dst, src) and dst.tobytes() == np.ascontiguousarray(src).tobytes()


def test_a_helper_threads_failure_reaches_the_caller_and_the_helpers_go_on():
    from hpcpar.datatypes.threads import _on_threads

    src, dst = np.arange(40.0), np.zeros(40)

    def copy(d, s):  # fails on the helper's span (not the caller's, which starts at 0)
        if s[0] != 0:
            raise ValueError("helper span refused")
        d[...] = s

    with pytest.raises(ValueError, match="helper span refused"):
        _on_threads(copy, dst, src, [0, 20, 40])
    assert np.array_equal(dst[:20], src[:20])  # the caller's part was still copied
    for _ in range(3):  # and the helpers still take work, right away and after a pause
        dst[:] = 0
        _on_threads(np.copyto, dst, src, [0, 10, 20, 30, 40])
        assert np.array_equal(dst, src)
        time.sleep(0.01)


def test_streaming_starts_at_an_eighth_of_this_ranks_share_of_the_cache(monkeypatch):
    from hpcpar.datatypes import kernels, threads

    monkeypatch.setattr(kernels, "_last_level_cache", lambda: 32 << 20)
    for env, want in (
        ({}, 4 << 20),
        ({"MPI_LOCALNRANKS": "2"}, 2 << 20),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "64"}, kernels.COMPILED_BYTES),
        ({"PMI_LOCAL_SIZE": "x"}, 4 << 20),
    ):
        for name in threads._LOCAL_RANKS:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert kernels.streaming_bytes() == want, env


def test_copy_threads_are_this_ranks_share_of_the_cores(monkeypatch):
    from hpcpar.datatypes import threads
    from hpcpar.runtime.env import usable_cores

    cores = usable_cores()
    for env, want in (
        ({"MPI_LOCALNRANKS": "1"}, min(cores, 8)),
        ({"MPI_LOCALNRANKS": str(2 * cores)}, 1),  # oversubscribed: one thread each
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, min(cores, 8)),
        ({"HPCPAR_COPY_THREADS": "3", "MPI_LOCALNRANKS": "64"}, 3),
        ({"HPCPAR_COPY_THREADS": "many"}, "HPCPAR_COPY_THREADS='many': expected a whole number"),
    ):
        for name in (*threads._LOCAL_RANKS, "HPCPAR_COPY_THREADS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(threads, "_thread_count", [])
        if isinstance(want, str):  # not a count: refused, naming the variable
            with pytest.raises(hpcpar.UsageError, match=want):
                threads.copy_threads()
        else:
            assert threads.copy_threads() == want, env
