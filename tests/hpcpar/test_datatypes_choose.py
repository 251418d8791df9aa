"""How a view is sent: as an MPI datatype or packed first, from the measured table or
the layout, on the host and from a GPU (``datatypes/choose.py``, ``gpu.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from datatype_layouts import irregular_type
from mpi4py import MPI

import hpcpar
from hpcpar import datatypes
from hpcpar.datatypes import DatatypeError
from hpcpar.datatypes.gpu import gpu_available


@pytest.mark.parametrize("crowded", [False, True])
def test_without_a_table_regular_layouts_go_as_datatypes_irregular_ones_packed(
    crowded, monkeypatch
):
    from hpcpar.datatypes import choose
    from hpcpar.runtime.profile import default_profile, profile_from_json

    monkeypatch.setattr(choose, "oversubscribed", lambda: crowded)
    rows = 64 + 2 * crowded  # a layout of its own per case: the choice is kept per layout
    regular = datatypes.plan(np.zeros((rows, 131072), np.uint8)[:, :65536])
    method, reason = choose.send_method(regular, profile=default_profile())
    assert method == ("pack" if crowded else "datatype")
    assert ("more ranks than cores" in reason) == crowded
    spots = np.sort(np.random.default_rng(rows).choice(8000, 1000, replace=False)) * 8
    dt = MPI.BYTE.Create_hindexed_block(8, [int(x) for x in spots]).Commit()  # 8,000 B
    try:
        method, reason = choose.send_method(datatypes.plan(dt), profile=default_profile())
        assert method == "pack" and "irregular" in reason
        # a measured table that favours datatypes for such blocks does not decide: it is
        # measured on regular vectors
        methods = {"send_methods": {"ranks": 2, "table": [[8, 8192, 1.0, 1e-6]]}}
        doc = {**default_profile().to_json(), "mpi_library": methods}
        fresh = MPI.BYTE.Create_hindexed_block(8, [int(x) + 8 for x in spots]).Commit()
        try:
            measured = profile_from_json(doc)
            assert choose.send_method(datatypes.plan(fresh), profile=measured)[0] == "pack"
        finally:
            fresh.Free()
    finally:
        dt.Free()


def test_oversubscribed_compares_the_launchers_ranks_with_the_nodes_cores(monkeypatch):
    from hpcpar.datatypes import choose

    monkeypatch.setattr(choose, "local_ranks", lambda: 4)
    monkeypatch.setattr(choose.os, "cpu_count", lambda: 2)
    assert choose.oversubscribed()
    monkeypatch.setattr(choose.os, "cpu_count", lambda: 4)
    assert not choose.oversubscribed()


def test_send_method_follows_the_measured_table():
    from hpcpar.datatypes.choose import send_method
    from hpcpar.runtime.profile import ProfileError, default_profile, profile_from_json

    table = [[8, 65536, 2e-4, 1e-4], [65536, 4194304, 1e-3, 2e-3]]
    doc = {
        **default_profile().to_json(),
        "mpi_library": {"send_methods": {"ranks": 2, "table": table}},
    }
    profile = profile_from_json(doc)
    small = datatypes.plan(np.zeros((4096, 16), np.uint8)[:, :8])
    big = datatypes.plan(np.zeros((64, 131072), np.uint8)[:, :65536])
    method, reason = send_method(small, profile=profile)
    assert method == "datatype"  # 32 KiB of 8 B blocks: half the measured class's bytes
    assert "predicted for 32768 B: pack 100.0 us, datatype 50.0 us" in reason
    assert send_method(big, profile=profile)[0] == "pack"
    tiny = datatypes.plan(np.zeros((64, 16), np.uint8)[:, :8])
    assert send_method(tiny, profile=default_profile())[0] == "datatype"  # no table: 512 B
    assert send_method(tiny, profile=profile)[0] == "datatype"  # the table's nearest class
    plane = MPI.DOUBLE.Create_subarray([8, 64, 64], [1, 64, 64], [3, 0, 0]).Commit()
    method, reason = send_method(datatypes.plan(plane), profile=default_profile())
    assert method == "datatype" and "contiguous" in reason  # 32 KiB, but nothing to pack
    plane.Free()
    # a fifth column, the stride: dense and sparse layouts of one block size differ
    doc["mpi_library"]["send_methods"]["table"] = [
        [8, 65536, 1e-4, 2e-4, 16],  # 8 B blocks 16 B apart: pack wins
        [8, 65536, 2e-4, 1e-4, 768],  # 8 B blocks 768 B apart (a z face): datatype wins
    ]
    strided = profile_from_json(doc)
    dense = datatypes.plan(np.zeros((8192, 2))[:, 0])
    sparse = datatypes.plan(np.zeros((96 * 96, 96))[:, 0])
    assert send_method(dense, profile=strided)[0] == "pack"
    assert send_method(sparse, profile=strided)[0] == "datatype"
    for bad in ([[8, 65536, 2e-4]], [[8, 65536, 1e-4, 2e-4, 16, 3]], [[8, 65536, 1, 2, "x"]]):
        doc["mpi_library"]["send_methods"]["table"] = bad
        with pytest.raises(ProfileError, match=r"send_methods\.table"):
            profile_from_json(doc)


class _FakeDeviceArray:
    """Only the CUDA array interface of a device array (nothing behind its pointer)."""

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "strides": strides,
            "typestr": "<f8",
            "data": (0, False),
            "version": 3,
        }


def test_device_send_method_follows_the_table_else_the_layout():
    from hpcpar.datatypes.choose import device_send_method, explain_send
    from hpcpar.runtime.profile import ProfileError, default_profile, profile_from_json

    bare = default_profile()
    column = datatypes.plan(np.zeros((64, 64))[:, :8])  # one strided run: one 2D copy
    interior = datatypes.plan(np.zeros((8, 8, 8))[1:-1, 1:-1, 1:-1])  # two strided dims
    backwards = datatypes.plan(np.zeros(64)[::-2])  # a 2D copy's pitch cannot be negative
    contiguous = datatypes.plan(np.zeros(64))
    assert device_send_method(column, bare)[0] == "staged"
    assert device_send_method(contiguous, bare)[0] == "staged"
    assert device_send_method(interior, bare)[0] == "device"
    assert device_send_method(backwards, bare)[0] == "device"
    table = [[64, 4096, 1e-5, 2e-5], [8, 4096, 3e-5, 2e-5]]  # [block, bytes, device s, staged s]
    doc = {**bare.to_json(), "mpi_library": {"device_send_methods": {"ranks": 1, "table": table}}}
    measured = profile_from_json(doc)
    method, reason = device_send_method(column, measured)  # 64 B blocks: the first row
    assert method == "device" and "measured at 64 B blocks / 4096 B: 20.0 and 10.0 us" in reason
    assert "predicted for 4096 B: staged 20.0 us, device 10.0 us" in reason  # 64 x 8 doubles
    assert device_send_method(backwards, measured)[0] == "staged"  # 8 B blocks: the second
    text = explain_send(_FakeDeviceArray((16, 4), (256, 8)), profile=bare)
    assert "send by: staged" in text and "typical block 32 B" in text
    doc["mpi_library"]["device_send_methods"]["table"] = [[8, 4096, 1e-5]]
    with pytest.raises(ProfileError, match=r"device_send_methods\.table must be \[\[block"):
        profile_from_json(doc)


def test_device_views_bad_input_without_a_gpu():
    with pytest.raises(DatatypeError, match="zero strides"):
        datatypes.plan(_FakeDeviceArray((4, 4), (0, 8)))
    fake = _FakeDeviceArray((4, 4), (64, 8))
    assert datatypes.plan(fake).size == 128  # the plan needs only the interface
    with pytest.raises(DatatypeError, match="GPU array must be auto, staged or device"):
        hpcpar.send(fake, 0, comm=MPI.COMM_SELF, method="pack")
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(DatatypeError, match="GPU array; sending or receiving it needs cupy"):
            hpcpar.send(fake, 0, comm=MPI.COMM_SELF)
        with pytest.raises(DatatypeError, match="needs cupy"):
            hpcpar.recv(fake, 0, comm=MPI.COMM_SELF)


@pytest.mark.skipif(not gpu_available(), reason="needs cupy and a GPU")
@pytest.mark.parametrize("method", ["staged", "device"])
def test_gpu_views_reach_the_host_and_back(method):
    import cupy

    from hpcpar.datatypes.gpu import device_to_host, host_to_device

    base = np.arange(16 * 18 * 20, dtype=np.float64).reshape(16, 18, 20)
    for index in (
        np.s_[:, :, 3],  # single words at a stride: one 2D copy
        np.s_[:, 4, :],  # rows
        np.s_[2],  # contiguous
        np.s_[1:-1, 1:-1, 1:-1],  # two strided dimensions: the kernel
        np.s_[::-1, :, ::-2],  # negative strides
    ):
        device = cupy.asarray(base)
        host = device_to_host(device[index], method)
        assert host.tobytes() == np.ascontiguousarray(base[index]).tobytes(), index
        target = cupy.zeros_like(device)
        host_to_device(host, target[index], method)
        want = np.zeros_like(base)
        want[index] = base[index]
        assert cupy.asnumpy(target).tobytes() == want.tobytes(), index
    fortran = cupy.asfortranarray(cupy.asarray(base[0]))
    assert device_to_host(fortran, method).tobytes() == np.ascontiguousarray(base[0]).tobytes()


@pytest.mark.skipif(not gpu_available(), reason="needs cupy and a GPU")
def test_gpu_packers_match_the_cpu_packer():
    import cupy

    from hpcpar.datatypes.gpu import pack_device, pack_to_host, unpack_device

    for dt in (
        MPI.DOUBLE.Create_subarray([32, 32, 32], [32, 32, 1], [0, 0, 0]),
        MPI.DOUBLE.Create_vector(64, 3, 7),
        MPI.Datatype.Create_struct([1, 2], [0, 16], [MPI.INT, MPI.DOUBLE]),
        *(
            irregular_type(kind)
            for kind in ("scattered 8 B blocks", "mixed lengths", "nested indexed")
        ),
    ):
        dt.Commit()
        p = datatypes.plan(dt)
        irregular = p._block_list() is not None  # one block_copy launch for all its blocks
        area = np.random.default_rng(1).integers(0, 256, 32 * 32 * 32 * 8 * 2).astype(np.uint8)
        want = p.pack(area, count=2)
        device = cupy.asarray(area)
        assert cupy.asnumpy(pack_device(p, device, count=2)).tobytes() == want.tobytes()
        assert pack_to_host(p, device).tobytes() == p.pack(area).tobytes()
        back = cupy.zeros_like(device)
        unpack_device(p, cupy.asarray(want), back, count=2)
        mine = np.zeros_like(area)
        p.unpack(want, mine, count=2)
        assert cupy.asnumpy(back).tobytes() == mine.tobytes()
        assert irregular == any(key[0] == "device blocks" for key in p._memo if len(key) == 2)
        dt.Free()
