"""Intercepted mpi4py collectives against the MPI library's own results, at any rank count.

Each test makes the same call twice: through an intercepted communicator
(``hpcpar.intercept.wrap``) and as the library's own method on a plain one, and
compares the results (bitwise where MPI's result is exact). The record proves that
hpcpar ran the call rather than passing it on.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from hpcpar.intercept import record, wrap
from hpcpar.intercept.calls import prepare
from hpcpar.intercept.comm import Intracomm
from hpcpar.intercept.message import Passthrough, message, vector
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi


@pytest.fixture
def pair(comm):
    """(intercepted, plain) views of one fresh communicator; freed afterwards."""
    base = comm.Dup()
    yield wrap(base), base
    base.Free()


def _carried(name: str) -> int:
    every = record.counts()
    return sum(n for (call, route, _), n in every.items() if call == name and route == "hpcpar")


def _same(got, want, comm, what, exact=True):
    ok = np.array_equal(got, want) if exact else np.allclose(got, want, rtol=1e-12)
    assert_all(bool(ok), what, comm)


FORMS = {
    "buffer": lambda a, t: a,
    "[buf, TYPE]": lambda a, t: [a, t],
    "[buf, count, TYPE]": lambda a, t: [a, a.size, t],
    "[buf, (count, 0), TYPE]": lambda a, t: [a, (a.size, 0), t],
    "(buf, typecode)": lambda a, t: (a, a.dtype.char),
}
TYPES = [
    (np.int32, MPI.INT),
    (np.int64, MPI.INT64_T),
    (np.uint8, MPI.UNSIGNED_CHAR),
    (np.float32, MPI.FLOAT),
    (np.float64, MPI.DOUBLE),
    (np.complex128, MPI.C_DOUBLE_COMPLEX),
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype,mpitype", TYPES, ids=[t[0].__name__ for t in TYPES])
def test_allreduce_every_form_and_type(pair, form, dtype, mpitype):
    icomm, plain = pair
    r = plain.Get_rank()
    x = (np.arange(7) * (r + 2) % 11).astype(dtype)
    got, want = np.zeros_like(x), np.zeros_like(x)
    before = _carried("Allreduce")
    icomm.Allreduce(FORMS[form](x, mpitype), FORMS[form](got, mpitype), op=MPI.SUM)
    plain.Allreduce(x, want, op=MPI.SUM)
    _same(got, want, plain, f"Allreduce {form} {dtype.__name__}")
    assert _carried("Allreduce") == before + 1


OPS = ["SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"]


@pytest.mark.parametrize("op", OPS)
def test_every_predefined_op_on_integers_in_place(pair, op):
    icomm, plain = pair
    r = plain.Get_rank()
    x = ((np.arange(12) + 3 * r) % 5).astype(np.int64)
    got, want = x.copy(), x.copy()
    icomm.Allreduce(MPI.IN_PLACE, got, op=getattr(MPI, op))
    plain.Allreduce(MPI.IN_PLACE, want, op=getattr(MPI, op))
    _same(got, want, plain, f"Allreduce IN_PLACE {op}")


@pytest.mark.parametrize("op", ["MINLOC", "MAXLOC"])
def test_minloc_maxloc_on_pair_types(pair, op):
    icomm, plain = pair
    r, p = plain.Get_rank(), plain.Get_size()
    t = np.dtype([("v", "f8"), ("i", "i4")], align=True)
    x = np.zeros(5, dtype=t)
    x["v"] = (np.arange(5) * 7 + 3 * r) % (p + 2)
    x["i"] = r
    got, want = np.zeros_like(x), np.zeros_like(x)
    icomm.Allreduce([x, MPI.DOUBLE_INT], [got, MPI.DOUBLE_INT], op=getattr(MPI, op))
    plain.Allreduce([x, MPI.DOUBLE_INT], [want, MPI.DOUBLE_INT], op=getattr(MPI, op))
    same = np.array_equal(got["v"], want["v"]) and np.array_equal(got["i"], want["i"])
    _same(same, True, plain, f"Allreduce {op}")  # fields: the padding is not data


def test_user_op_is_applied_in_rank_order(pair):
    icomm, plain = pair
    r = plain.Get_rank()

    def affine(inbuf, inoutbuf, datatype):  # (a, b) then (c, d): (a*c, b*c + d)
        a = np.frombuffer(inbuf, dtype=np.float64).reshape(-1, 2)
        b = np.frombuffer(inoutbuf, dtype=np.float64).reshape(-1, 2)
        b[:, 1] = a[:, 1] * b[:, 0] + b[:, 1]
        b[:, 0] = a[:, 0] * b[:, 0]

    op = MPI.Op.Create(affine, commute=False)
    try:
        x = np.array([[r + 2.0, r - 1.0], [1.5, r]], dtype=np.float64)
        got, want = np.zeros_like(x), np.zeros_like(x)
        icomm.Allreduce([x, 4, MPI.DOUBLE], [got, 4, MPI.DOUBLE], op=op)
        plain.Allreduce([x, 4, MPI.DOUBLE], [want, 4, MPI.DOUBLE], op=op)
    finally:
        op.Free()
    _same(got, want, plain, "Allreduce with a non-commutative user op", exact=False)


def test_reduce_and_bcast_at_every_root(pair):
    icomm, plain = pair
    r, p = plain.Get_rank(), plain.Get_size()
    for root in range(p):
        x = np.arange(9, dtype=np.float64) * (r + 1)
        got, want = np.full(9, -1.0), np.full(9, -1.0)
        icomm.Reduce(x, got if r == root else None, op=MPI.MAX, root=root)
        plain.Reduce(x, want if r == root else None, op=MPI.MAX, root=root)
        _same(got, want, plain, f"Reduce to {root}")
        if r == root:
            got = x.copy()
            icomm.Reduce(MPI.IN_PLACE, [got, MPI.DOUBLE], op=MPI.SUM, root=root)
        else:
            icomm.Reduce([x, MPI.DOUBLE], None, op=MPI.SUM, root=root)
        want = np.zeros(9)
        plain.Reduce(x, want if r == root else None, op=MPI.SUM, root=root)
        if r != root:
            got = want
        _same(got, want, plain, f"Reduce IN_PLACE to {root}")
        b = np.arange(6, dtype=np.int16) + root if r == root else np.zeros(6, np.int16)
        icomm.Bcast([b, MPI.SHORT], root=root)
        _same(b, np.arange(6, dtype=np.int16) + root, plain, f"Bcast from {root}")


def test_gathers_scatters_and_alltoalls(pair):
    icomm, plain = pair
    r, p = plain.Get_rank(), plain.Get_size()
    x = np.arange(3, dtype=np.int32) + 10 * r
    got, want = np.zeros(3 * p, np.int32), np.zeros(3 * p, np.int32)
    icomm.Allgather(x, got)
    plain.Allgather(x, want)
    _same(got, want, plain, "Allgather")
    got = np.zeros(3 * p, np.int32)
    got[3 * r : 3 * r + 3] = x
    icomm.Allgather(MPI.IN_PLACE, [got, MPI.INT])
    _same(got, want, plain, "Allgather IN_PLACE")
    counts = [i % 3 + 1 for i in range(p)]
    displs = [5 * i for i in range(p)]
    mine = np.arange(counts[r], dtype=np.float64) + r
    got, want = np.full(5 * p, -1.0), np.full(5 * p, -1.0)
    icomm.Allgatherv(mine, [got, counts, displs, MPI.DOUBLE])
    plain.Allgatherv(mine, [want, counts, displs, MPI.DOUBLE])
    _same(got, want, plain, "Allgatherv with gaps")
    big = np.arange(4 * p, dtype=np.float64) * (r + 1)
    got, want = np.zeros(4), np.zeros(4)
    icomm.Reduce_scatter_block(big, got, op=MPI.SUM)
    plain.Reduce_scatter_block(big, want, op=MPI.SUM)
    _same(got, want, plain, "Reduce_scatter_block", exact=False)
    got = big.copy()
    icomm.Reduce_scatter_block(MPI.IN_PLACE, got, op=MPI.SUM)
    _same(got[:4], want, plain, "Reduce_scatter_block IN_PLACE", exact=False)
    rc = [i + 1 for i in range(p)]
    vec = np.arange(sum(rc), dtype=np.int64) * (r + 1)
    got, want = np.zeros(rc[r], np.int64), np.zeros(rc[r], np.int64)
    icomm.Reduce_scatter(vec, got, rc, op=MPI.SUM)
    plain.Reduce_scatter(vec, want, rc, op=MPI.SUM)
    _same(got, want, plain, "Reduce_scatter")
    got = np.zeros(rc[r], np.int64)
    icomm.Reduce_scatter(vec, got, op=MPI.SUM)  # counts gathered, as mpi4py does
    _same(got, want, plain, "Reduce_scatter without recvcounts")
    a2a = np.arange(2 * p, dtype=np.int32) + 100 * r
    got, want = np.zeros_like(a2a), np.zeros_like(a2a)
    icomm.Alltoall(a2a, got)
    plain.Alltoall(a2a, want)
    _same(got, want, plain, "Alltoall")
    icomm.Alltoall([a2a, 2, MPI.INT], [got, 2, MPI.INT])
    _same(got, want, plain, "Alltoall with a count per rank")
    scounts = [(r + i) % 3 for i in range(p)]
    rcounts = [(i + r) % 3 for i in range(p)]
    sdispls = [4 * i for i in range(p)]
    rdispls = [4 * i + 1 for i in range(p)]
    send = np.arange(4 * p, dtype=np.float32) + 1000 * r
    got, want = np.full(4 * p + 1, -1, np.float32), np.full(4 * p + 1, -1, np.float32)
    icomm.Alltoallv([send, scounts, sdispls, MPI.FLOAT], [got, rcounts, rdispls, MPI.FLOAT])
    plain.Alltoallv([send, scounts, sdispls, MPI.FLOAT], [want, rcounts, rdispls, MPI.FLOAT])
    _same(got, want, plain, "Alltoallv with displacements")
    icomm.Barrier()
    for name in ("Allgather", "Allgatherv", "Reduce_scatter", "Alltoall", "Alltoallv", "Barrier"):
        assert _carried(name) > 0, name


def test_nonblocking_and_persistent_forms(pair):
    icomm, plain = pair
    r, p = plain.Get_rank(), plain.Get_size()
    x = np.arange(10, dtype=np.float64) + r
    want = np.zeros(10)
    plain.Allreduce(x, want)
    got = np.zeros(10)
    req = icomm.Iallreduce(x, got)
    assert isinstance(req, MPI.Request)
    req.Wait()
    _same(got, want, plain, "Iallreduce + Wait")
    assert req == MPI.REQUEST_NULL
    # the library's own Waitall over a mix of intercepted and library requests
    got, gathered = np.zeros(10), np.zeros(p, np.int64)
    mixed = [
        icomm.Iallreduce(x, got),
        plain.Iallgather(np.array([r], np.int64), gathered),
        icomm.Ibarrier(),
    ]
    MPI.Request.Waitall(mixed)
    _same(got, want, plain, "Iallreduce in Request.Waitall")
    _same(gathered, np.arange(p), plain, "library Iallgather beside it")
    b = np.arange(4.0) if r == 0 else np.zeros(4)
    req = icomm.Ibcast(b, root=0)
    while not req.Test():
        pass
    _same(b, np.arange(4.0), plain, "Ibcast + Test")
    y = np.zeros(10)
    persistent = icomm.Allreduce_init(x, y, op=MPI.SUM)
    assert isinstance(persistent, MPI.Prequest)
    for step in range(3):
        x[:] = step + r
        persistent.Start()
        persistent.Wait()
        _same(y, np.full(10, step * p + p * (p - 1) / 2), plain, f"Allreduce_init start {step}")
    persistent.Free()


def test_an_algorithm_set_while_running_takes_effect_within_64_calls(pair, monkeypatch):
    icomm, plain = pair
    p = plain.Get_size()
    x, got = np.ones(8), np.zeros(8)
    for _ in range(3):  # the library's call, decided and kept on the communicator
        icomm.Allreduce(x, got)
    before = sum(n for (c, _, why), n in record.counts().items() if why == "ran ring")
    monkeypatch.setenv("HPCPAR_ALGORITHM_ALLREDUCE", "ring")
    for _ in range(64):
        icomm.Allreduce(x, got)
        _same(got, np.full(8, float(p)), plain, "Allreduce while the algorithm changes")
    after = sum(n for (c, _, why), n in record.counts().items() if why == "ran ring")
    assert_all(after > before, f"ring ran {after - before} times", plain)


def test_derived_communicators_stay_intercepted_and_agree(pair):
    icomm, plain = pair
    r, p = plain.Get_rank(), plain.Get_size()
    made = [
        icomm.Dup(),
        icomm.Split(r % 2, p - r),
        icomm.Split_type(MPI.COMM_TYPE_SHARED),
        icomm.Create(icomm.Get_group()),
        icomm.Create_cart([p], periods=[True]),
    ]
    try:
        for sub in made:
            assert isinstance(sub, Intracomm) or type(sub).__module__ == "hpcpar.intercept.comm"
            x = np.arange(5, dtype=np.int64) * (sub.Get_rank() + 1)
            got, want = np.zeros(5, np.int64), np.zeros(5, np.int64)
            sub.Allreduce(x, got)
            MPI.Intracomm.Allreduce(sub, x, want)  # the library's own call, on purpose
            _same(got, want, plain, f"Allreduce on {type(sub).__name__}")
    finally:
        for sub in made:
            sub.Free()


def test_what_hpcpar_leaves_to_the_library_gives_the_library_result(pair):
    icomm, plain = pair
    r = plain.Get_rank()
    vec = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()
    try:
        area = np.arange(6.0) if r == 0 else np.zeros(6)
        want = area.copy() if r == 0 else np.where(np.arange(6) % 2 == 0, np.arange(6.0), 0.0)
        icomm.Bcast([area, 1, vec], root=0)
        _same(area, want, plain, "Bcast of a derived datatype")
    finally:
        vec.Free()
    assert any(
        call == "Bcast" and route == "library" and "derived" in reason
        for (call, route, reason) in record.counts()
    )
    # lower-case (pickle) calls are mpi4py's own
    assert icomm.allreduce(r) == plain.allreduce(r)


def test_bad_arguments_raise_what_the_library_raises(pair):
    icomm, plain = pair
    p = plain.Get_size()

    def raised(call):
        try:
            call()
        except MPI.Exception as exc:
            return ("MPI", exc.Get_error_class())
        except Exception as exc:  # the type is what is compared
            return (type(exc).__name__,)
        return None

    x, short = np.zeros(4), np.zeros(3)
    cases = {
        "counts differ": lambda c: c.Allreduce(x, short),
        "types differ": lambda c: c.Allreduce([x, MPI.DOUBLE], [np.zeros(4, "i"), MPI.INT]),
        "root out of range": lambda c: c.Bcast(x, root=p + 3),
        "not a buffer": lambda c: c.Allreduce("text", x),
        "MIN on complex": lambda c: c.Allreduce(x.astype(complex), np.zeros(4, complex), MPI.MIN),
        "BAND on float": lambda c: c.Allreduce(x, np.zeros(4), op=MPI.BAND),
        "SUM on bool": lambda c: c.Allreduce(np.ones(4, bool), np.zeros(4, bool)),
        "MAXLOC on a plain type": lambda c: c.Allreduce(x, np.zeros(4), op=MPI.MAXLOC),
        "REPLACE": lambda c: c.Allreduce(x, np.zeros(4), op=MPI.REPLACE),
        "Reduce to a root below 0": lambda c: c.Reduce(x, np.zeros(4), root=-1),
        # the same array as send and receive buffer (not IN_PLACE), after calls that
        # leave hpcpar's decision for the size on the communicator
        "aliased buffers": lambda c: (c.Allreduce(x, np.zeros(4)), c.Allreduce(x, x)),
        "aliased again": lambda c: c.Allreduce(x, x),
    }
    for what, case in cases.items():
        mine = raised(lambda case=case: case(icomm))
        theirs = raised(lambda case=case: case(plain))
        assert mine is not None and mine == theirs, (what, mine, theirs)


def test_message_reader_matches_mpi4py_forms():
    a = np.arange(12, dtype=np.float64)
    assert message([a, (4, 2), MPI.DOUBLE], writable=False).tolist() == [2, 3, 4, 5]
    assert message([a, 3, MPI.DOUBLE], writable=False, blocks=2).size == 6
    assert message(a, writable=False, blocks=4).size == 12
    with pytest.raises(Passthrough, match="blocks"):
        message(a, writable=False, blocks=5)
    v = vector([a, (2, 5), MPI.DOUBLE], 2, writable=True)
    assert (v.counts, v.displs) == ([2, 2], [0, 5])
    v = vector([a, MPI.DOUBLE], 5, writable=True)
    assert v.counts == [3, 3, 2, 2, 2] and v.displs == [0, 3, 6, 8, 10]
    with pytest.raises(Passthrough, match="read-only"):
        message(np.frombuffer(b"abcd", np.uint8), writable=True)
    with pytest.raises(Passthrough, match="non-contiguous"):
        message(a[::2], writable=False)
    pairs = MPI.DOUBLE.Create_contiguous(2)
    try:
        with pytest.raises(Passthrough, match="derived"):
            message([a, pairs], writable=False)
    finally:
        pairs.Free()
    assert prepare("Barrier", MPI.COMM_SELF, ()) is not None


@pytest.mark.parametrize("algorithm", ["auto", "binomial"])
def test_bcast_of_a_derived_datatype_packed_where_hpcpar_runs_it(pair, monkeypatch, algorithm):
    """Packed with the datatype's plan when the model picks hpcpar's algorithm, else the
    library's call with the datatype: the same bytes land either way."""
    icomm, plain = pair
    r = plain.Get_rank()
    if algorithm != "auto":
        monkeypatch.setenv("HPCPAR_ALGORITHM_BCAST", algorithm)
    vec = MPI.DOUBLE.Create_vector(300, 2, 3).Commit()
    extent = vec.Get_extent()[1] // 8
    try:
        for count in (1, 4):
            source = np.arange(extent * count + 1, dtype=np.float64)
            got = source.copy() if r == 0 else np.full_like(source, -1.0)
            want = source.copy() if r == 0 else np.full_like(source, -1.0)
            before = _carried("Bcast")
            icomm.Bcast([got, count, vec], root=0)
            MPI.Intracomm.Bcast(plain, [want, count, vec], root=0)  # the library's
            _same(got, want, plain, f"Bcast of {count} vector(s), {algorithm}")
            assert (_carried("Bcast") > before) == (algorithm != "auto")
    finally:
        vec.Free()
