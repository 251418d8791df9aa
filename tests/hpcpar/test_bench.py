"""The benchmark harness: sizes, statistics, output format, and a real short sweep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpcpar.bench import Variant, format_size, parse_size, size_range, sweep
from hpcpar.bench.harness import format_header, format_row, quartile_spread
from hpcpar.cli.main import main
from hpcpar.errors import UsageError
from hpcpar.runtime.switches import HOT
from hpcpar.testing import assert_all


@pytest.mark.parametrize(
    ("text", "value"), [("8", 8), ("64KiB", 65536), ("1M", 1 << 20), ("2 GiB", 2 << 30), ("3b", 3)]
)
def test_parse_size(text, value):
    assert parse_size(text) == value
    assert parse_size(format_size(value)) == value


@pytest.mark.parametrize("text", ["", "x", "1.5MiB", "12Q", "-4"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_size_range():
    assert size_range(8, 64) == [8, 16, 32, 64]
    assert size_range(0, 2) == [0, 1, 2]
    assert size_range(8, 8 << 20)[-1] == 8 << 20
    with pytest.raises(UsageError):
        size_range(16, 8)


def test_spread_is_the_relative_interquartile_range():
    assert quartile_spread([1.0]) == 0.0
    assert quartile_spread([1.0, 1.0, 1.0]) == 0.0
    assert quartile_spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(100.0 * (4 - 2) / 3)


@pytest.mark.mpi
def test_sweep_measures_validates_and_compares(comm):
    calls = {"fast": 0}

    def fast(nbytes):
        data = np.ones(max(1, nbytes // 8))

        def op():
            calls["fast"] += 1
            data.sum()

        return op, lambda: True

    def wrong(nbytes):
        return (lambda: None), (lambda: comm.Get_rank() != 0)

    rows = sweep(
        comm,
        [Variant("fast", fast), Variant("wrong", wrong)],
        [8, 1024],
        peer="fast",
        repeats=3,
        warmup=1,
        min_time=0.001,
    )
    assert [(m.size, m.variant) for m in rows] == [
        (8, "fast"),
        (8, "wrong"),
        (1024, "fast"),
        (1024, "wrong"),
    ]
    by = {(m.size, m.variant): m for m in rows}
    assert_all(all(by[(s, "fast")].vs_peer == 1.0 for s in (8, 1024)), "peer ratio", comm)
    assert_all(
        all(not by[(s, "wrong")].valid for s in (8, 1024)), "validation not collective", comm
    )
    assert_all(
        all(m.min_us <= m.avg_us <= m.max_us and m.iterations >= 1 for m in rows), "stats", comm
    )
    # warmup + calibration + repeats * iterations calls per size
    expected = sum(1 + 1 + 3 * by[(s, "fast")].iterations for s in (8, 1024))
    assert_all(calls["fast"] == expected, f"call count {calls['fast']} != {expected}", comm)
    header, row = format_header(), format_row(rows[0])
    assert header.startswith("#") and "Avg(us)" in header and "busbw(GB/s)" in header
    assert len(row.split()) == len(header.lstrip("#").split())


@pytest.mark.slow
@pytest.mark.mpi
def test_allreduce_mpi_benchmark_end_to_end(comm, tmp_path, capsys):
    prefix = comm.bcast(str(tmp_path / "ar"), root=0)
    status = main(
        [
            "bench",
            "allreduce-mpi",
            "--max-size",
            "256",
            "--repeats",
            "2",
            "--min-time",
            "0.001",
            "--output",
            prefix,
        ]
    )
    assert_all(status == 0, "benchmark failed", comm)
    if comm.Get_rank() == 0:
        out = capsys.readouterr().out
        assert out.startswith("# hpcpar bench allreduce-mpi")
        doc = json.loads(open(prefix + ".json").read())
        rows = doc["results"]
        assert {r["variant"] for r in rows} == {"mpi", "mpi4py-pickle"}
        assert [r["size"] for r in rows if r["variant"] == "mpi"] == [8, 16, 32, 64, 128, 256]
        assert all(r["valid"] for r in rows)
        assert doc["metadata"]["ranks"] == comm.Get_size()
        assert open(prefix + ".csv").readline().startswith("size,variant,avg_us")


@pytest.mark.slow
@pytest.mark.mpi
def test_datatypes_benchmark_end_to_end(comm, tmp_path, capsys):
    prefix = comm.bcast(str(tmp_path / "dt"), root=0)
    argv = [
        "bench",
        "datatypes",
        "--n",
        "8",
        "--large",
        "1MiB",
        "--no-roof",
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--min-time",
        "0.0005",
        "--output",
        prefix,
    ]
    assert_all(main(argv) == 0, "benchmark failed", comm)
    if comm.Get_rank() == 0:
        rows = json.loads(open(prefix + ".json").read())["results"]
        cases = {r["case"] for r in rows}
        # every pack and unpack checked against numpy's or MPI's bytes
        assert rows and all(r["valid"] for r in rows)
        small = {c for c in cases if c.startswith("small:")}
        assert len(small) == 3 and {"x face (contiguous plane)", "interior (N-2)^3"} <= cases
        sizes = {r["case"]: r["size"] for r in rows}
        assert sorted(sizes[c] for c in small) == [64, 2048, 2048]
        # the cache-line traffic each case implies: the z face a whole line a double
        lines = {r["case"]: r["read_per_packed"] for r in rows if "lines_read" in r}
        assert lines["small: z face of a 16^3 block (2 KiB)"] == 8.0
        assert 1.0 <= lines["x face (contiguous plane)"] <= 1.125  # 512 B: one line more at most
        variants = {"hpcpar-pack", "hpcpar-packer", "mpi-pack", "numpy", "hpcpar-unpack"}
        variants |= {"hpcpar-pack-new", "numpy-ascontiguousarray"}  # into new buffers
        assert {r["variant"] for r in rows if r["case"] in small} == {
            *variants,
            "hpcpar-unpacker",
            "mpi-unpack",
        }
        assert ("halo" in cases) == (comm.Get_size() > 1)  # against hand-written Sendrecv
        sends = {c for c in cases if c.startswith("send: ")}  # round trips, byte-checked
        assert len(sends) == (7 if comm.Get_size() > 1 else 0)
        assert {r["variant"] for r in rows if r["case"] in sends} == (
            {"hpcpar-send", "hpcpar-send-datatype", "hpcpar-send-persistent", "mpi-datatype"}
            | {"numpy+Send"}
            if sends
            else set()
        )


@pytest.mark.slow
@pytest.mark.mpi
def test_checkpoint_benchmark_end_to_end(comm, tmp_path, capsys):
    folder = comm.bcast(str(tmp_path), root=0)
    layout = "ppn:1" if comm.Get_size() > 1 else None
    args = ["bench", "checkpoint", "--min-size", "1MiB", "--max-size", "1MiB", "--repeats", "1"]
    args += ["--warmup", "0", "--dir", folder, "--output", f"{folder}/ck"]
    status = main(args + (["--layout", layout] if layout else []))
    assert_all(status == 0, "benchmark failed", comm)
    if comm.Get_rank() == 0:
        out = capsys.readouterr().out
        assert out.startswith("# hpcpar bench checkpoint")
        rows = json.loads(open(f"{folder}/ck.json").read())["results"]
        names = {r["variant"] for r in rows}
        expect = {"dd-roof", "dd-overwrite", "np.save+fsync", "h5py-sync", "hpcpar-stall"}
        expect |= {"hpcpar-flush"}
        expect |= {"restore-local", "restore-hdf5", "compute+flush", "hpcpar-stall-lazy"}
        if layout:
            expect |= {"restore-partner", "restore-xor"}
        assert names == expect and all(r["valid"] for r in rows)
        assert all(r["median_s"] > 0 for r in rows)
    leftovers = [p.name for p in Path(folder).iterdir() if p.name.startswith("hpcpar-bench-ckpt")]
    assert not leftovers


@pytest.mark.slow
@pytest.mark.mpi
def test_cfr_benchmark_end_to_end(comm, tmp_path, capsys):
    pytest.importorskip("pyspiel", reason="the peer is OpenSpiel (open_spiel)")
    prefix = comm.bcast(str(tmp_path / "cfr"), root=0)
    args = ["bench", "cfr", "--games", "kuhn_poker", "--budget", "0.05", "--repeats", "1"]
    status = main([*args, "--no-python-dcfr", "--output", prefix])
    assert_all(status == 0, "benchmark failed", comm)
    if comm.Get_rank() == 0:
        rows = json.loads(open(prefix + ".json").read())["results"]
        names = {r["variant"] for r in rows}
        assert names == {
            "hpcpar-cfr",
            "hpcpar-cfr+",
            "hpcpar-dcfr",
            "hpcpar-pcfr+",
            "openspiel-cpp-cfr",
            "openspiel-cpp-cfr+",
        }
        cfr = next(r for r in rows if r["variant"] == "openspiel-cpp-cfr")
        assert cfr["speedup_vs_openspiel_cpp_cfr"] == 1.0
        # the curves fall: exploitability of the last point below the first
        for r in rows:
            curve = r["curve"]
            assert curve[-1]["exploitability"] <= curve[0]["exploitability"]


def _sgd_rows(comm, tmp_path, extra):
    prefix = comm.bcast(str(tmp_path / "sgd"), root=0)
    args = ["bench", "sgd", "--epochs", "2", "--repeats", "1", "--target", "0.5", "--batch", "60"]
    args += extra  # a global batch of 60 divides among 1, 2, 3 and 4 ranks
    status = main([*args, "--output", prefix])
    assert_all(status == 0, "benchmark failed", comm)
    rows = json.loads(open(prefix + ".json").read())["results"] if comm.Get_rank() == 0 else None
    return comm.bcast(rows, root=0)


@pytest.mark.slow
@pytest.mark.mpi
def test_sgd_benchmark_modes_and_sklearn_peer(comm, tmp_path):
    pytest.importorskip("sklearn", reason="digits and the SGDClassifier peer need scikit-learn")
    rows = _sgd_rows(comm, tmp_path, ["--model", "softmax", "--modes", "sync,local", "--no-torch"])
    by = {r["variant"]: r for r in rows}
    expect = {"hpcpar-sync", "hpcpar-local", "sklearn-sgdclassifier"}
    if comm.Get_size() > 1:
        expect.add("hpcpar-sync@1")
        assert by["hpcpar-sync"]["scaling_efficiency"] > 0
        assert by["hpcpar-sync"]["overlap"] is None or 0 <= by["hpcpar-sync"]["overlap"] <= 1
    assert set(by) == expect
    assert by["hpcpar-sync"]["vs_peer"] == 1.0  # without torch the peer is hpcpar's sync
    for r in rows:  # every one learns digits (10 classes) well beyond chance in 2 epochs
        assert r["valid"] and r["final_test_accuracy"] > 0.8, r
        assert r["samples_per_s_min"] <= r["samples_per_s_median"] <= r["samples_per_s_max"]
        assert r["time_to_target_s"] is not None and 0 <= r["comm_share"] < 1
    # same model, data order, batch and step: sync at any rank count = sync on one rank
    if comm.Get_size() > 1:
        assert by["hpcpar-sync"]["final_loss"] == pytest.approx(by["hpcpar-sync@1"]["final_loss"])


@pytest.mark.mpi
def test_sgd_benchmark_torch_ddp_trains_the_same_model(comm, tmp_path):
    pytest.importorskip("torch", reason="the DDP peer needs torch (pip install torch)")
    pytest.importorskip("sklearn", reason="digits needs scikit-learn")
    rows = _sgd_rows(comm, tmp_path, ["--modes", "sync", "--hidden", "16"])
    by = {r["variant"]: r for r in rows}
    assert by["torch-ddp-gloo"]["vs_peer"] == 1.0
    # the same network, initial weights, batches and step size: the same losses
    assert by["torch-ddp-gloo"]["final_loss"] == pytest.approx(
        by["hpcpar-sync"]["final_loss"], rel=1e-9
    )


def test_datatypes_benchmark_gpu_needs_a_gpu(capsys):
    from hpcpar.datatypes.gpu import gpu_available

    if gpu_available():
        pytest.skip("a GPU is here: the GPU cases run (test_gpu_standin runs them elsewhere)")
    assert main(["bench", "datatypes", "--gpu", "--n", "8", "--no-roof"]) == 2
    err = capsys.readouterr().err
    assert "--gpu: needs cupy and a GPU on every rank" in err and "Traceback" not in err


def test_sgd_benchmark_rejects_bad_modes(capsys):
    assert main(["bench", "sgd", "--modes", "sync,bogus", "--no-torch"]) == 2
    assert "--modes takes sync, local, async, hogwild" in capsys.readouterr().err


FAKE_PROBSAT = """#!/bin/sh
# prints what probSAT prints (its statistics block), for the parser
echo "c numFlips                      : 1234"
echo "c flips/sec                     : 5000000"
echo "c CPU Time                      : 0.0100"
echo "s SATISFIABLE"
"""
FAKE_YALSAT = """#!/bin/sh
# prints what yalsat -v prints of its search (its statistics lines), for the parser
echo "s SATISFIABLE"
echo "c 4000 flips, 2000.00 thousand flips per second"
echo "c total process time of 0.01 seconds"
"""


@pytest.mark.slow
@pytest.mark.mpi
def test_sat_benchmark_end_to_end(comm, tmp_path):
    import os

    prefix = comm.bcast(str(tmp_path / "sat"), root=0)
    fake = comm.bcast(str(tmp_path / "probSAT"), root=0)
    fake_yalsat = comm.bcast(str(tmp_path / "yalsat"), root=0)
    if comm.Get_rank() == 0:
        for path, text in ((fake, FAKE_PROBSAT), (fake_yalsat, FAKE_YALSAT)):
            Path(path).write_text(text)
            os.chmod(path, 0o755)
    comm.Barrier()
    args = ["bench", "sat", "--sizes", "50", "--seeds", "3", "--repeats", "2", "--flips", "20000"]
    args += [
        "--portfolio-runs",
        "3",
        "--peer-binary",
        fake,
        "--yalsat-binary",
        fake_yalsat,
        "--output",
        prefix,
    ]
    assert_all(main(args) == 0, "benchmark failed", comm)
    if comm.Get_rank() == 0:
        rows = json.loads(open(prefix + ".json").read())["results"]
        by = {r["variant"]: r for r in rows}
        ours, peer = by["hpcpar"], by["probsat-c"]
        assert ours["solved"] == ours["runs"] == 3 and ours["flips_per_s"]["median"] > 0
        assert peer["flips_per_s"]["median"] == pytest.approx(1234 / 0.01)  # parsed
        assert ours["flips_per_s_vs_peer"] == pytest.approx(
            ours["flips_per_s"]["median"] / peer["flips_per_s"]["median"]
        )
        yalsat = by["yalsat"]
        assert yalsat["flips_per_s"]["median"] == pytest.approx(2e6)  # its reported rate
        assert yalsat["time_to_solution_s"]["median"] == pytest.approx(4000 / 2e6)
        assert ours["flips_per_s_vs_yalsat"] == pytest.approx(ours["flips_per_s"]["median"] / 2e6)
        if comm.Get_size() > 1:
            p = by["hpcpar-portfolio"]
            assert p["ranks"] == comm.Get_size() and p["runs"] == 3
            assert p["predicted"]["exponential"] == pytest.approx(comm.Get_size())
        else:
            assert "hpcpar-portfolio" not in by


def test_cache_lines_a_layout_reads_against_a_brute_force_count():
    from mpi4py import MPI

    from hpcpar.bench.datatype_cases import LINE, lines_read
    from hpcpar.datatypes import plan

    rng = np.random.default_rng(4)
    layouts = [
        MPI.DOUBLE.Create_subarray([32, 32, 32], [32, 32, 1], [0, 0, 0]),  # z face: a line each
        MPI.DOUBLE.Create_subarray([32, 32, 32], [32, 1, 32], [0, 5, 0]),  # y face: rows
        MPI.BYTE.Create_vector(100, 8, 16),  # 8 B blocks, four to a line
        MPI.BYTE.Create_indexed([3, 70, 1, 200], [0, 2, 130, 120]),  # overlapping lines
    ]
    for dt in layouts:
        dt.Commit()
        kernels = plan(dt)._kernels(1)
        for address in (0, 8, 60, int(rng.integers(0, 1 << 20))):
            touched = set()  # every byte's line, one by one
            for k in kernels:
                starts = [address + k.src]
                for count, stride, _ in k.dims:
                    starts = [s + i * stride for s in starts for i in range(count)]
                for s in starts:
                    touched.update(range(s // LINE, (s + k.size - 1) // LINE + 1))
            assert lines_read(kernels, address) == len(touched), (dt, address)
        dt.Free()


@pytest.mark.mpi
def test_soak_checks_every_random_collective_and_memory(comm, tmp_path, capsys):
    prefix = comm.bcast(str(tmp_path / "soak"), root=0)
    status = main(["bench", "soak", "--calls", "150", "--max-count", "64", "--output", prefix])
    assert_all(status == 0, "soak found a wrong result or memory growth", comm)
    if comm.Get_rank() == 0:
        rows = json.loads(open(prefix + ".json").read())["results"]
        from hpcpar.bench.soak import COLLECTIVES

        assert {r["variant"] for r in rows} == set(COLLECTIVES)
        assert sum(r["iterations"] for r in rows) == 150 and all(r["valid"] for r in rows)
        assert f"results wrong: 0 of {150 * comm.Get_size()}" in capsys.readouterr().out


@pytest.mark.mpi
def test_a_wrong_result_fails_the_soak(comm, monkeypatch, tmp_path):
    from hpcpar.bench import soak

    real = soak._right
    monkeypatch.setattr(soak, "_right", lambda d, got, c: real(d, got, c) and d.i != 7)
    status = main(["bench", "soak", "--calls", "20", "--max-count", "8"])
    assert_all(status == 1, "a wrong result must fail the soak", comm)


@pytest.mark.mpi
@pytest.mark.parametrize("feature", ["flight", "guard"])
def test_the_safety_benchmarks_compare_on_and_off_and_leave_the_feature_on(comm, tmp_path, feature):
    from hpcpar.runtime import flight

    prefix = comm.bcast(str(tmp_path / feature), root=0)
    status = main(
        [
            "bench",
            feature,
            "--repeats",
            "2",
            "--min-time",
            "0.001",
            "--warmup",
            "1",
            "--output",
            prefix,
        ]
    )
    assert_all(status == 0, "benchmark failed", comm)
    assert_all(flight.enabled() and HOT.guard, "the feature was left off", comm)
    if comm.Get_rank() == 0:
        rows = json.loads(open(prefix + ".json").read())["results"]
        calls = ("allreduce", "bcast", "iallreduce", "allreduce-ring")
        assert {r["variant"] for r in rows} == {*calls, *(f"{c}-off" for c in calls)}
        assert all(r["valid"] and r["vs_peer"] > 0 for r in rows)


@pytest.mark.mpi
def test_compression_benchmarks_end_to_end(comm, tmp_path, capsys):
    prefix = comm.bcast(str(tmp_path / "cmp"), root=0)
    common = ["--min-size", "256KiB", "--max-size", "256KiB", "--repeats", "2", "--min-time"]
    status = main(
        [
            "bench",
            "collectives",
            "--compression",
            "int8,1bit,auto",
            "--layout",
            "ppn:1",
            *common,
            "0.001",
            "--output",
            prefix,
        ]
    )
    assert_all(status == 0, "bench collectives --compression failed", comm)
    if comm.Get_rank() == 0:
        rows = json.loads(open(prefix + ".json").read())["results"]
        names = {r["variant"] for r in rows}
        assert names == {"mpi-direct", "exact-auto", "int8", "1bit", "auto"}
        assert all(r["valid"] for r in rows)  # each within its scheme's bound
        assert next(r for r in rows if r["variant"] == "exact-auto")["vs_peer"] == 1.0
    status = main(["bench", "codecs", *common, "0.001", "--output", prefix + "-codecs"])
    assert_all(status == 0, "bench codecs failed", comm)
    if comm.Get_rank() == 0:
        rows = json.loads(open(prefix + "-codecs.json").read())["results"]
        assert {r["variant"] for r in rows} >= {"memcpy", "fp16", "bf16", "int8", "1bit"}
        assert all(r["valid"] for r in rows)
    assert main(["bench", "collectives", "--compression", "zip", *common, "0.001"]) == 2
    err = capsys.readouterr().err
    assert comm.Get_rank() != 0 or "unknown compression" in err, err
