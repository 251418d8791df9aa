"""Non-contiguous point-to-point and halo exchange at any rank count, against global arrays."""

from __future__ import annotations

import gc
import itertools
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import hpcpar
from hpcpar.datatypes import DatatypeError
from hpcpar.datatypes.gpu import gpu_available
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi


def test_views_and_datatypes_over_a_ring(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    grid = np.arange(6 * 8, dtype=np.float64).reshape(6, 8) + 100 * rank
    column = np.zeros(6)
    hpcpar.sendrecv(grid[:, 3], right, column, left)  # a strided column
    ok = np.array_equal(column, np.arange(3, 48, 8) + 100 * left)
    block = np.zeros((3, 8))
    requests = [hpcpar.irecv(block[:, ::-1], left, tag=5), hpcpar.isend(grid[::2], right, tag=5)]
    requests[1].wait()
    requests[0].wait()
    ok &= np.array_equal(block[:, ::-1], (np.arange(48.0).reshape(6, 8) + 100 * left)[::2])
    vec = MPI.DOUBLE.Create_vector(3, 2, 5).Commit()
    area = np.arange(20.0) + 1000 * rank
    got = np.zeros(20)
    req = hpcpar.irecv(got, left, tag=9, datatype=vec)
    hpcpar.send(area, right, tag=9, datatype=vec)
    req.wait()
    want = np.zeros(20)
    src = np.arange(20.0) + 1000 * left
    for b in range(3):
        want[5 * b : 5 * b + 2] = src[5 * b : 5 * b + 2]
    ok &= np.array_equal(got, want)
    vec.Free()
    assert_all(bool(ok), "non-contiguous point-to-point", comm)


@pytest.mark.parametrize("method", ["pack", "datatype", "auto"])
def test_views_of_padded_records_over_a_ring(comm, method):
    """Records with padding (which mpi4py maps to no MPI type) travel as their bytes."""
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    record = np.dtype([("a", "i1"), ("b", "f8")], align=True)
    raw = np.dtype((np.void, record.itemsize))

    def table(who: int) -> np.ndarray:
        t = np.zeros((6, 8), record)
        t["a"], t["b"] = who, np.arange(48.0).reshape(6, 8) + 100 * who
        return t

    got = np.zeros((6, 8), record)
    req = hpcpar.irecv(got[::2, 1::3], left, tag=7)
    hpcpar.send(table(rank)[1::2, ::3], right, tag=7, method=method)
    req.wait()
    ok = got[::2, 1::3].view(raw).tobytes() == table(left)[1::2, ::3].view(raw).tobytes()
    again = np.zeros((6, 8), record)
    if size == 1:
        hpcpar.sendrecv(table(rank)[:, 2], right, again[:, 5], left)
    elif rank % 2 == 0:
        hpcpar.send(table(rank)[:, 2], right, tag=8, method=method)
        hpcpar.recv(again[:, 5], left, tag=8, method=method)
    else:
        hpcpar.recv(again[:, 5], left, tag=8, method=method)
        hpcpar.send(table(rank)[:, 2], right, tag=8, method=method)
    ok &= again[:, 5].view(raw).tobytes() == table(left)[:, 2].view(raw).tobytes()
    ok &= not again[:, :5].view(raw).tobytes().strip(b"\0")  # nothing outside the view
    assert_all(bool(ok), "records over a ring", comm)


def test_size_mismatch_is_an_error(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    with pytest.raises(DatatypeError, match="longer than the 40 bytes expected"):
        hpcpar.sendrecv(np.zeros(10), right, np.zeros((5, 2))[:, 0].reshape(5), left)
    with pytest.raises(DatatypeError, match="read-only"):
        frozen = np.zeros(3)
        frozen.flags.writeable = False
        hpcpar.recv(frozen, left)


def global_value(coords):
    return sum(c * 1000**k for k, c in enumerate(coords))


@pytest.mark.parametrize("ndims", [1, 2, 3])
@pytest.mark.parametrize("periodic", [False, True])
@pytest.mark.parametrize(
    "on",
    [
        "host",  # contiguous faces in place, small ones as MPI datatypes (no table)
        "host, packed",  # a measured table that says pack
        "host, datatypes",  # a measured table that says send MPI datatypes
        "host, Fortran order",  # no face is in place: every one packed
        pytest.param(
            "gpu", marks=pytest.mark.skipif(not gpu_available(), reason="needs cupy and a GPU")
        ),
    ],
)
def test_halo_exchange_matches_the_global_array(comm, ndims, periodic, on, tmp_path, monkeypatch):
    if on in ("host, packed", "host, datatypes"):
        import json

        from hpcpar.runtime.profile import default_profile

        pack, typed = (1e-6, 1e-3) if on == "host, packed" else (1e-3, 1e-6)
        doc = default_profile().to_json()
        doc["mpi_library"] = {"send_methods": {"ranks": 2, "table": [[8, 64, pack, typed]]}}
        path = tmp_path / f"profile-{comm.Get_rank()}.json"
        path.write_text(json.dumps(doc))
        monkeypatch.setenv("HPCPAR_PROFILE", str(path))
    size = comm.Get_size()
    dims = MPI.Compute_dims(size, ndims)
    cart = comm.Create_cart(dims, periods=[periodic] * ndims, reorder=False)
    local = tuple([4, 3, 2][:ndims])
    width = 1 if ndims == 3 else 2 if ndims == 2 else 3
    width = min(width, *local)
    halo = hpcpar.HaloExchange(cart, local, width, np.float64)
    coords = cart.Get_coords(cart.Get_rank())
    global_shape = [d * n for d, n in zip(dims, local, strict=True)]
    a = np.full(halo.shape, -1.0)
    for idx in itertools.product(*(range(s) for s in halo.shape)):
        g = [c * n + i - width for c, n, i in zip(coords, local, idx, strict=True)]
        inside = all(width <= i < width + n for i, n in zip(idx, local, strict=True))
        if inside:
            a[idx] = global_value(g)
    if on == "gpu":
        import cupy

        a = cupy.asnumpy(halo.exchange(cupy.asarray(a)))
    elif on == "host, Fortran order":
        a = halo.exchange(np.asfortranarray(a))
    else:
        halo.exchange(a)
    bad = []
    for idx in itertools.product(*(range(s) for s in halo.shape)):
        g = [c * n + i - width for c, n, i in zip(coords, local, idx, strict=True)]
        if periodic:
            g = [x % G for x, G in zip(g, global_shape, strict=True)]
        exists = all(0 <= x < G for x, G in zip(g, global_shape, strict=True))
        want = global_value(g) if exists else -1.0
        if a[idx] != want:
            bad.append((idx, a[idx], want))
    halo.free()
    cart.Free()
    assert_all(not bad, f"halo {ndims}D periodic={periodic}: {bad[:3]}", comm)


def test_halo_bad_input(comm):
    with pytest.raises(hpcpar.HpcparError, match="Cartesian"):
        hpcpar.HaloExchange(comm, (4,), 1, np.float64)
    cart = comm.Create_cart([comm.Get_size()], periods=[True])
    with pytest.raises(hpcpar.HpcparError, match="wider"):
        hpcpar.HaloExchange(cart, (2,), 3, np.float64)
    halo = hpcpar.HaloExchange(cart, (4,), 1, np.float64)
    with pytest.raises(DatatypeError, match="shape"):
        halo.exchange(np.zeros(5))
    halo.free()
    cart.Free()


@pytest.mark.parametrize(
    ("send_method", "recv_method"),
    [("pack", "datatype"), ("datatype", "pack"), ("datatype", "datatype")],
)
def test_zero_copy_datatype_method_interoperates_with_packing(comm, send_method, recv_method):
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        pytest.skip("blocking send and receive between two ranks (a rank cannot block on itself)")
    right, left = (rank + 1) % size, (rank - 1) % size
    grid = np.arange(7 * 9, dtype=np.float64).reshape(7, 9) + 100 * rank
    got = np.zeros((7, 9))
    if rank % 2 == 0:
        hpcpar.send(grid[::2, ::-3], right, tag=3, method=send_method)
        hpcpar.recv(got[::2, 1:4], left, tag=3, method=recv_method)
    else:
        hpcpar.recv(got[::2, 1:4], left, tag=3, method=recv_method)
        hpcpar.send(grid[::2, ::-3], right, tag=3, method=send_method)
    want = np.zeros((7, 9))
    want[::2, 1:4] = (np.arange(63.0).reshape(7, 9) + 100 * left)[::2, ::-3]
    ok = np.array_equal(got, want)
    # the same layouts again, at other offsets with new values: the zero-copy path reuses
    # the MPI datatype it made for the layout, which must not carry the old offset
    got2 = np.zeros((7, 9))
    if rank % 2 == 0:
        hpcpar.send((grid + 0.5)[1::2, -2::-3], right, tag=4, method=send_method)
        hpcpar.recv(got2[1::2, 5:8], left, tag=4, method=recv_method)
    else:
        hpcpar.recv(got2[1::2, 5:8], left, tag=4, method=recv_method)
        hpcpar.send((grid + 0.5)[1::2, -2::-3], right, tag=4, method=send_method)
    want2 = np.zeros((7, 9))
    want2[1::2, 5:8] = (np.arange(63.0).reshape(7, 9) + 100 * left + 0.5)[1::2, -2::-3]
    ok &= np.array_equal(got2, want2)
    # nothing hpcpar keeps (plans, types, owners' addresses) holds a sent array alive
    import gc
    import weakref

    sent = grid * 2.0
    gone = weakref.ref(sent)
    if rank % 2 == 0:
        hpcpar.send(sent[::2, 1:4], right, tag=5, method=send_method)
        hpcpar.recv(got2[::2, 1:4], left, tag=5, method=recv_method)
    else:
        hpcpar.recv(got2[::2, 1:4], left, tag=5, method=recv_method)
        hpcpar.send(sent[::2, 1:4], right, tag=5, method=send_method)
    del sent
    gc.collect()
    ok &= gone() is None
    ok &= np.array_equal(got2[::2, 1:4], (np.arange(63.0).reshape(7, 9) + 100 * left)[::2, 1:4] * 2)
    # an MPI datatype, either method on either side
    vec = MPI.DOUBLE.Create_vector(3, 2, 5).Commit()
    area = np.arange(20.0) + 1000 * rank
    into = np.zeros(21)
    if rank % 2 == 0:
        hpcpar.send(area, right, tag=6, datatype=vec, count=1, method=send_method)
        hpcpar.recv(into, left, tag=6, datatype=vec, method=recv_method)
    else:
        hpcpar.recv(into, left, tag=6, datatype=vec, method=recv_method)
        hpcpar.send(area, right, tag=6, datatype=vec, count=1, method=send_method)
    vec.Free()
    want3 = np.zeros(21)
    for b in range(3):
        want3[5 * b : 5 * b + 2] = np.arange(5 * b, 5 * b + 2) + 1000 * left
    ok &= np.array_equal(into, want3)
    assert_all(bool(ok), f"{send_method} -> {recv_method}", comm)


@pytest.mark.parametrize("method", ["auto", "pack", "datatype"])
def test_persistent_sends_and_receives_repeat_with_new_values(comm, method):
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    grid = np.zeros((7, 9))
    got = np.full((7, 9), -1.0)
    area, into = np.zeros(20), np.full(21, -1.0)
    whole, landing = np.zeros(12), np.full(12, -1.0)
    vec = MPI.DOUBLE.Create_vector(3, 2, 5).Commit()
    sends = [
        hpcpar.send_init(grid[1::2, ::-3], right, tag=11, comm=comm, method=method),
        hpcpar.send_init(area, right, tag=12, comm=comm, datatype=vec, method=method),
        hpcpar.send_init(whole, right, tag=13, comm=comm),  # contiguous: as it is
    ]
    recvs = [
        hpcpar.recv_init(got[1::2, 5:8], left, tag=11, comm=comm, method=method),
        hpcpar.recv_init(into, left, tag=12, comm=comm, datatype=vec, method=method),
        hpcpar.recv_init(landing, left, tag=13, comm=comm),
    ]
    assert (got == -1).all() and (into == -1).all()  # making them wrote nothing
    ok = True
    for step in range(3):  # new values each step: each start sends what is there now
        grid[...] = np.arange(63.0).reshape(7, 9) + 100 * rank + 1000 * step
        area[...] = np.arange(20.0) + 100 * rank + 1000 * step
        whole[...] = np.arange(12.0) - 100 * rank - 1000 * step
        for r in recvs:
            r.start()
        for q in sends:
            q.start()
        for q in [*sends, *recvs]:
            q.wait()
        want = np.full((7, 9), -1.0)
        want[1::2, 5:8] = (np.arange(63.0).reshape(7, 9) + 100 * left + 1000 * step)[1::2, ::-3]
        ok &= np.array_equal(got, want)
        want_into = np.full(21, -1.0)
        for b in range(3):
            want_into[5 * b : 5 * b + 2] = np.arange(5 * b, 5 * b + 2) + 100 * left + 1000 * step
        ok &= np.array_equal(into, want_into)
        ok &= np.array_equal(landing, np.arange(12.0) - 100 * left - 1000 * step)
    for q in [*sends, *recvs]:
        q.wait()  # not started again: returns at once, nothing unpacked
        q.free()
    ok &= np.array_equal(landing, np.arange(12.0) - 100 * left - 2000)
    with hpcpar.send_init(grid[:, 0], MPI.PROC_NULL, comm=comm) as q:  # to nobody
        q.start()
        q.wait()
    frozen = np.zeros(20)
    frozen.flags.writeable = False
    with pytest.raises(DatatypeError, match="read-only"):
        hpcpar.recv_init(frozen, left, comm=comm, datatype=vec, method=method)
    with pytest.raises(DatatypeError, match="reach bytes"):
        hpcpar.recv_init(np.zeros(4), left, comm=comm, datatype=vec, method=method)
    with pytest.raises(DatatypeError, match="reach bytes"):
        hpcpar.send_init(np.zeros(4), right, comm=comm, datatype=vec, method=method)
    vec.Free()
    assert_all(bool(ok), f"persistent {method}", comm)


@pytest.mark.parametrize("method", ["pack", "datatype"])
def test_persistent_requests_keep_their_arrays_alive(comm, method):
    # zero copy hands MPI the view's address, not an array: the request itself must keep
    # the memory of a view nobody else holds (and whose base nobody else holds)
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    bases = [np.arange(40.0) + 100 * rank, np.full(60, -1.0)]
    alive = [weakref.ref(b) for b in bases]
    send = hpcpar.send_init(bases[0][::-2], right, tag=31, comm=comm, method=method)
    recv = hpcpar.recv_init(bases[1][::3], left, tag=31, comm=comm, method=method)
    del bases
    gc.collect()
    junk = [np.full(40, 7.0) for _ in range(50)]  # memory a freed base would have given up
    recv.start()
    send.start()
    send.wait()
    recv.wait()
    got = alive[1]()
    ok = all(a() is not None for a in alive) and got is not None
    ok &= got is not None and np.array_equal(got[::3], (np.arange(40.0) + 100 * left)[::-2])
    ok &= bool((junk[0] == 7.0).all())
    send.free()
    recv.free()
    del send, recv, got
    gc.collect()
    ok &= all(a() is None for a in alive)  # freed with the requests
    assert_all(bool(ok), f"persistent {method}: arrays kept alive", comm)


def test_empty_views_travel(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    for method in ("pack", "datatype", "auto"):
        empty = np.zeros((4, 6))[::2, 3:3]
        landing = np.zeros((4, 6))[1::2, 0:0]
        pending = hpcpar.irecv(landing, left, tag=32, comm=comm)  # no rank waits on another
        hpcpar.send(empty, right, tag=32, comm=comm, method=method)
        pending.wait()
        pending = hpcpar.isend(empty, right, tag=33, comm=comm)
        assert hpcpar.recv(landing, left, tag=33, comm=comm, method=method).size == 0
        pending.wait()


def test_persistent_receive_refuses_a_longer_message(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    r = hpcpar.recv_init(np.zeros((6, 4))[:, 0], left, tag=21, comm=comm, method="pack")
    r.start()
    req = hpcpar.isend(np.zeros(10), right, tag=21, comm=comm)
    with pytest.raises(DatatypeError, match="longer than the 48 bytes expected"):
        r.wait()
    req.wait()
    r.free()


def test_explain_send_and_bad_method(comm):
    from hpcpar.datatypes.choose import explain_send, oversubscribed

    text = explain_send(np.zeros((8, 8))[:, ::2])  # 256 B: MPI walks it, no table needed
    assert "send by: datatype" in text and "typical block 8 B" in text
    text = explain_send(np.zeros((64, 64))[:, ::2])  # 16 KiB: as a datatype, or packed
    crowded = oversubscribed()  # with more ranks than cores (3 and 4 ranks here)
    assert f"send by: {'pack' if crowded else 'datatype'}" in text
    assert "typical block 8 B" in text and ("more ranks than cores" in text) == crowded
    with pytest.raises(DatatypeError, match="method must be"):
        hpcpar.send(np.zeros((4, 4))[:, 0], comm.Get_rank(), method="smoke")
    vec = MPI.DOUBLE.Create_vector(3, 2, 5).Commit()
    for method in ("datatype", "pack"):  # refused before anything is sent: no rank waits
        with pytest.raises(DatatypeError, match="reach bytes"):
            hpcpar.send(np.zeros(4), comm.Get_rank(), datatype=vec, method=method)
    frozen = np.zeros(20)
    frozen.flags.writeable = False
    for method in ("datatype", "pack"):  # refused before receiving: nothing is consumed
        with pytest.raises(DatatypeError, match="read-only"):
            hpcpar.recv(frozen, comm.Get_rank(), datatype=vec, method=method)
        with pytest.raises(DatatypeError, match="reach bytes"):
            hpcpar.recv(np.zeros(4), comm.Get_rank(), datatype=vec, method=method)
    with pytest.raises(DatatypeError, match="reach bytes"):
        hpcpar.irecv(np.zeros(4), comm.Get_rank(), datatype=vec)
    vec.Free()


@pytest.mark.skipif(not gpu_available(), reason="needs cupy and a GPU")
@pytest.mark.parametrize("method", ["auto", "staged", "device"])
def test_gpu_views_over_a_ring(comm, method):
    import cupy

    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    host_grid = np.arange(6 * 8 * 5, dtype=np.float64).reshape(6, 8, 5)
    grid = cupy.asarray(host_grid + 1000 * rank)
    want_grid = host_grid + 1000 * left
    column = cupy.zeros(6)
    hpcpar.sendrecv(grid[:, 3, 0], right, column, left)  # auto
    ok = np.array_equal(cupy.asnumpy(column), want_grid[:, 3, 0])
    got = cupy.zeros((6, 8, 5))
    requests = [
        hpcpar.irecv(got[::2, ::-1, 1:3], left, tag=5),
        hpcpar.isend(grid[1::2, :, 2:4], right, tag=5),
    ]
    requests[1].wait()
    requests[0].wait()
    want = np.zeros((6, 8, 5))
    want[::2, ::-1, 1:3] = want_grid[1::2, :, 2:4]
    ok &= np.array_equal(cupy.asnumpy(got), want)
    if size > 1:  # blocking both ways between two ranks, with the method asked for
        face = cupy.zeros((6, 5))
        if rank % 2 == 0:
            hpcpar.send(grid[:, 7, :], right, tag=7, method=method)
            hpcpar.recv(face, left, tag=7, method=method)
        else:
            hpcpar.recv(face, left, tag=7, method=method)
            hpcpar.send(grid[:, 7, :], right, tag=7, method=method)
        ok &= np.array_equal(cupy.asnumpy(face), want_grid[:, 7, :])
        cpu = np.zeros((6, 5))  # a GPU array's bytes received into host memory
        if rank % 2 == 0:
            hpcpar.send(grid[:, 0, :], right, tag=8, method=method)
            hpcpar.recv(cpu, left, tag=8)
        else:
            hpcpar.recv(cpu, left, tag=8)
            hpcpar.send(grid[:, 0, :], right, tag=8, method=method)
        ok &= np.array_equal(cpu, want_grid[:, 0, :])
    assert_all(ok, f"GPU views over a ring, {method}", comm)
