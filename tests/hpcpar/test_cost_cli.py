"""explain, simulate and calibrate from the command line, and auto with a calibrated profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpcpar.runtime.profile import load_profile

pytestmark = [pytest.mark.slow]  # starts whole jobs: left out of dev.py test --quick


def hpcpar(*args, env=None, timeout=120):
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "HPCPAR_"))
    }
    return subprocess.run(
        [sys.executable, "-m", "hpcpar", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, **(env or {})},
    )


def one_error(proc, message):
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_explain_a_large_machine():
    proc = hpcpar(
        "explain", "allreduce", "1MiB", "--nodes", "1024", "--ppn", "64", "--network", "2us,25GB/s"
    )
    assert proc.returncode == 0, proc.stderr
    assert "on 65536 rank(s), 1024 node(s)" in proc.stdout
    assert "auto runs: " in proc.stdout and "reason:" in proc.stdout
    for name in ("ring", "rabenseifner", "two_level", "multi_leader", "pipelined"):
        assert name in proc.stdout


def test_explain_this_job_without_a_profile_keeps_the_library():
    proc = hpcpar("explain", "bcast", "64KiB")
    assert proc.returncode == 0, proc.stderr
    assert "auto runs: mpi" in proc.stdout and "no calibrated profile" in proc.stdout


def test_explain_bad_input(tmp_path):
    one_error(hpcpar("explain", "gather", "1MiB"), "invalid choice: 'gather'")
    one_error(hpcpar("explain", "allreduce", "lots"), "bad size 'lots'")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    one_error(hpcpar("explain", "allreduce", "1MiB", "--profile", str(bad)), "not valid JSON")
    one_error(hpcpar("explain", "allreduce", "8", "--nodes", "4"), "both --nodes and --ppn")
    one_error(hpcpar("explain", "allreduce", "8", "--network", "fast"), "bad network 'fast'")
    env = {"HPCPAR_PROFILE": str(tmp_path / "absent.json")}
    one_error(hpcpar("explain", "allreduce", "8", env=env), "cannot read profile")


def test_simulate_writes_the_map(tmp_path):
    prefix = tmp_path / "sim"
    proc = hpcpar(
        "simulate",
        "--nodes",
        "128",
        "--ppn",
        "8",
        "--network",
        "2us,25GB/s",
        "--output",
        str(prefix),
    )
    assert proc.returncode == 0, proc.stderr
    assert "winner by size" in proc.stdout and "1GiB" in proc.stdout
    rows = (tmp_path / "sim.csv").read_text().splitlines()
    assert rows[0] == "nodes,ppn,nbytes,algorithm,seconds,winner" and len(rows) > 100
    assert (tmp_path / "sim.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one_error(hpcpar("simulate", "--nodes", "0", "--ppn", "4"), "--nodes: expected an integer")
    one_error(hpcpar("simulate", "--nodes", "2048", "--ppn", "64"), "65536")


@pytest.mark.slow
def test_calibrate_then_auto_follows_the_profile(tmp_path):
    profile_path = tmp_path / "profile.json"
    proc = hpcpar(
        "launch",
        "-n",
        "2",
        "--layout",
        "ppn:1",
        "--timeout",
        "120",
        "--",
        "calibrate",
        "--output",
        str(profile_path),
        "--repeats",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    profile = load_profile(profile_path)
    assert profile.calibrated and profile.intra.alpha_s > 0 and profile.inter.beta_s_per_byte > 0
    assert json.loads(profile_path.read_text())["mpi_library"]["allreduce"]["ranks"] == 2
    script = tmp_path / "auto.py"
    script.write_text(
        "import numpy as np, hpcpar\n"
        "from hpcpar.collectives import last_stats\n"
        "from hpcpar.collectives.tally import Layout\n"
        "from hpcpar.collectives.cost.explain import plan_for\n"
        "h = hpcpar.Hierarchy(layout='ppn:1')\n"
        "for n in (1, 1 << 12, 1 << 21):\n"
        "    x = np.arange(n, dtype=float) + h.rank\n"
        "    y = hpcpar.allreduce(x, comm=h)\n"
        "    assert np.array_equal(y, 2 * np.arange(n) + 1)\n"
        "    want = plan_for('allreduce', x.nbytes, Layout(tuple(h.node_of))).algorithm\n"
        "    got = last_stats().algorithm\n"
        "    every = h.comm.allgather(got)\n"
        "    assert got == want and len(set(every)) == 1, (got, want, every)\n"
        "    print('size', x.nbytes, 'auto ran', got, flush=True)\n"
    )
    proc = hpcpar(
        "launch",
        "-n",
        "2",
        "--timeout",
        "120",
        "--",
        str(script),
        env={"HPCPAR_PROFILE": str(profile_path)},
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert proc.stdout.count("auto ran") == 6
