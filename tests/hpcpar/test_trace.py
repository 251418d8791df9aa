"""HPCPAR_TRACE and ``hpcpar trace``: every rank's record written and read back, the first
divergence between ranks, ranks that arrive late, and a Chrome timeline; checked on
synthetic records whose answers are known, and on real jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launching import clean_env, hpcpar

from hpcpar.runtime import trace

JOB = str(Path(__file__).parent.parent / "helpers" / "watchdog_job.py")


def entry(seq, operation="allreduce", start=0.0, end=None, count=3, comm="world", **more):
    return {
        "comm": comm,
        "seq": seq,
        "operation": operation,
        "algorithm": "mpi",
        "count": count,
        "dtype": "float64",
        "op": "SUM",
        "root": None,
        "site": "job.py:9 in main",
        "start": start,
        "end": end,
        "calls": 1,
        **more,
    }


def write(folder, rank, entries, host="node0"):
    doc = {
        "format": "hpcpar-trace",
        "version": 1,
        "rank": rank,
        "host": host,
        "pid": 1,
        "entries": entries,
    }
    (folder / f"rank{rank}.json").write_text(json.dumps(doc))


def test_the_first_divergence_is_a_different_call_or_a_rank_that_never_arrived(tmp_path):
    for rank in range(3):
        calls = [entry(s, start=s, end=s + 0.5) for s in range(5)]
        if rank == 1:
            calls[3] = entry(3, "bcast", count=5, start=3, end=3.5)
        if rank == 2:
            calls = calls[:2]
        write(tmp_path, rank, calls)
    loaded = trace.load(tmp_path)
    found = trace.first_divergence(loaded)
    assert found.startswith("world #2: rank(s) 0,1 called allreduce (mpi, count 3, float64)")
    assert "rank 2 never got there (its last call on world was #1" in found
    write(tmp_path, 2, [entry(s, start=s, end=s + 0.5) for s in range(5)])
    found = trace.first_divergence(trace.load(tmp_path))
    assert found == (
        "world #3: rank(s) 0,2 called allreduce (mpi, count 3, float64); "
        "rank(s) 1 called bcast (mpi, count 5, float64)"
    )


def test_runs_of_calls_are_compared_as_runs_however_long():
    """A record's run of 10^15 identical calls (a long job, or a crafted file) is one
    comparison, not one per call; a rank that stopped early is still named."""
    long = 10**15
    loaded = {0: [entry(0, calls=long)], 1: [entry(0, calls=long - 7)]}
    found = trace.first_divergence(loaded)
    assert found.startswith(f"world #{long - 7}: rank(s) 0 called allreduce")
    assert f"rank 1 never got there (its last call on world was #{long - 8}" in found
    loaded[1] = [entry(0, calls=5), entry(5, calls=long - 5)]
    assert trace.first_divergence(loaded) is None


def test_a_rank_that_arrives_late_again_and_again_is_named(tmp_path):
    for rank in range(4):
        late = 0.004 if rank == 2 else 0.0001 * rank
        write(tmp_path, rank, [entry(s, start=s + late, end=s + 0.01) for s in range(30)])
    slow, lags = trace.slow_ranks(trace.load(tmp_path), window=20)
    assert [s["rank"] for s in slow] == [2] and slow[0]["calls"] == 20
    assert lags[2] == pytest.approx(0.004) and lags[0] == 0.0
    # nobody is late: no verdict; too few calls: no verdict
    for rank in range(4):
        write(tmp_path, rank, [entry(s, start=s, end=s + 0.01) for s in range(30)])
    assert trace.slow_ranks(trace.load(tmp_path))[0] == []
    for rank in range(4):
        write(
            tmp_path,
            rank,
            [entry(s, start=s + (0.004 if rank == 2 else 0), end=s + 0.01) for s in range(5)],
        )
    assert trace.slow_ranks(trace.load(tmp_path))[0] == []


def test_clocks_of_other_hosts_are_aligned_on_the_ends_of_collectives(tmp_path):
    write(tmp_path, 0, [entry(s, start=s, end=s + 0.5) for s in range(10)], host="a")
    write(tmp_path, 1, [entry(s, start=s + 100.2, end=s + 100.5) for s in range(10)], host="b")
    write(tmp_path, 2, [entry(s, start=s + 0.1, end=s + 0.7) for s in range(10)], host="a")
    loaded = trace.load(tmp_path)
    offsets = trace.clock_offsets(loaded)
    assert offsets == {0: 0.0, 1: pytest.approx(100.0), 2: 0.0}  # rank 2 shares rank 0's
    events = trace.chrome_trace(loaded)["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 30
    one = next(e for e in spans if e["pid"] == 1 and e["args"]["seq"] == 0)
    assert one["ts"] == pytest.approx(0.2e6) and one["dur"] == pytest.approx(0.3e6)
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {
        "rank 0",
        "rank 1",
        "rank 2",
    }


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not a trace file"),
        ('{"format": "other"}', "not an hpcpar trace file"),
        ('{"format": "hpcpar-trace", "version": 9}', "trace version 9"),
        (
            '{"format": "hpcpar-trace", "version": 1, "rank": 0, "host": "h", "entries": [{}]}',
            "entry 0: bad 'comm'",
        ),
    ],
)
def test_bad_trace_files_are_one_line_and_status_2(tmp_path, content, message):
    (tmp_path / "rank0.json").write_text(content)
    with pytest.raises(trace.TraceError, match=message):
        trace.load(tmp_path)
    done = hpcpar("trace", str(tmp_path))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    missing = hpcpar("trace", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "no such folder" in missing.stderr


@pytest.mark.reliability("bad_input")
def test_records_of_two_jobs_in_one_folder_are_refused_not_merged(tmp_path):
    for rank in range(4):
        write(tmp_path, rank, [entry(0, start=0, end=1)])
    for rank in range(2):  # a later job of 2 ranks writes over ranks 0 and 1
        doc = json.loads((tmp_path / f"rank{rank}.json").read_text())
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({**doc, "size": 2, "job": "b"}))
    with pytest.raises(
        trace.TraceError,
        match=r"records of different jobs \(rank\(s\) 0,1 of a "
        r"job of 2 rank\(s\) \(b\); rank\(s\) 2,3 of a job of None",
    ):
        trace.load(tmp_path)


@pytest.mark.slow
@pytest.mark.reliability("bad_input")
def test_a_folder_traced_by_two_jobs_is_refused_with_one_line(tmp_path):
    folder = tmp_path / "trace"
    for ranks in (4, 2):
        job = hpcpar(
            "launch",
            "-n",
            str(ranks),
            "--timeout",
            "90",
            "--",
            JOB,
            "slow",
            "0.001",
            env=clean_env(HPCPAR_TRACE=str(folder)),
            timeout=120,
        )
        assert job.returncode == 0, job.stderr
    shown = hpcpar("trace", str(folder))
    assert shown.returncode == 2, shown.stdout
    assert "records of different jobs" in shown.stderr and "of a job of 4 rank(s)" in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1, shown.stderr


@pytest.mark.slow
def test_a_traced_job_names_its_slow_rank_and_opens_in_perfetto(tmp_path):
    folder = tmp_path / "trace"
    job = hpcpar(
        "launch",
        "-n",
        "3",
        "--timeout",
        "90",
        "--",
        JOB,
        "slow",
        "0.01",
        env=clean_env(HPCPAR_TRACE=str(folder)),
        timeout=120,
    )
    assert job.returncode == 0, job.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.json", "rank1.json", "rank2.json"]
    shown = hpcpar("trace", str(folder), "--chrome", str(tmp_path / "t.json"))
    assert shown.returncode == 0, shown.stderr
    assert "first divergence: none" in shown.stdout
    assert "slow rank: rank 2 arrives" in shown.stdout, shown.stdout
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    allreduces = [e for e in events if e.get("name") == "allreduce" and e["ph"] == "X"]
    assert len(allreduces) == 3 * (3 + 20)  # every call its own span on every rank


@pytest.mark.slow
def test_a_job_the_watchdog_ends_leaves_its_trace_with_the_divergence(tmp_path):
    folder = tmp_path / "trace"
    job = hpcpar(
        "launch",
        "-n",
        "3",
        "--timeout",
        "90",
        "--watchdog",
        "2",
        "--",
        JOB,
        "mismatch",
        env=clean_env(HPCPAR_TRACE=str(folder)),
        timeout=120,
    )
    assert job.returncode == 4, job.stderr
    shown = hpcpar("trace", str(folder))
    assert shown.returncode == 0, shown.stderr
    assert (
        "first divergence: world #4: rank(s) 0 called allreduce (mpi, count 3, float64); "
        "rank(s) 1,2 called bcast (mpi, count 5, float64, root 0)"
    ) in shown.stdout, shown.stdout


@pytest.mark.slow
def test_the_watchdog_warns_live_about_a_rank_that_arrives_late_while_tracing(tmp_path):
    job = hpcpar(
        "launch",
        "-n",
        "3",
        "--timeout",
        "90",
        "--watchdog",
        "30",
        "--",
        JOB,
        "slow",
        "0.2",
        env=clean_env(HPCPAR_TRACE=str(tmp_path / "t")),
        timeout=120,
    )
    assert job.returncode == 0, job.stderr
    warnings = [line for line in job.stderr.splitlines() if line.startswith("hpcpar watchdog:")]
    assert len(warnings) == 1, job.stderr
    assert warnings[0].startswith("hpcpar watchdog: rank 2 arrives "), warnings
    assert "the others wait for it" in warnings[0]
