"""The virtual cluster: command plans (pure), and real namespaces where root allows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from hpcpar.vcluster.netns import ClusterSpec, VClusterError, _setup_commands, parse_link, plan_run

pytestmark = [
    pytest.mark.xdist_group("vcluster"),  # one virtual cluster on the machine at a time
    pytest.mark.alone,  # TCP between namespaces: its time-outs assume the cores are free
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hpcpar(*args, timeout=300, user=None):
    cmd = [sys.executable, "-m", "hpcpar", *args]
    if user:
        cmd = [
            "setpriv",
            f"--reuid={user}",
            f"--regid={user}",
            "--clear-groups",
            *cmd,
        ]  # numeric ids
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "HPCPAR_"))
    }
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def leftovers() -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    ours = [word for word in links.split() if word.startswith("hpv")]
    return [n for n in names if n.startswith("hpv-")] + ours


def namespaces_work() -> str | None:
    """None if this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if not all(shutil.which(t) for t in ("ip", "tc", "unshare")):
        return "needs ip, tc and unshare (iproute2, util-linux)"
    name = f"hpv-probe-{os.getpid()}"  # each pytest worker probes with a name of its own
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return (
        None if probe.returncode == 0 else f"cannot make network namespaces: {probe.stderr.strip()}"
    )


WHY_NOT = namespaces_work()
needs_namespaces = pytest.mark.skipif(WHY_NOT is not None, reason=f"virtual cluster: {WHY_NOT}")


def test_link_shaping_arguments():
    assert parse_link("20us,10gbit") == ["netem", "delay", "20us", "rate", "10gbit"]
    assert parse_link("1ms,100mbit", netem=False)[:3] == ["tbf", "rate", "100mbit"]
    for bad in ("20us", "fast,10gbit", "20us,10gbps", "20,10gbit"):
        with pytest.raises(VClusterError, match="bad --link"):
            parse_link(bad)


def test_setup_and_run_plans():
    spec = ClusterSpec(3, "20us,10gbit", "10.213.9")
    cmds = [" ".join(c) for c in _setup_commands(spec)]
    assert "ip addr add 10.213.9.1/24 dev hpvbr0" in cmds
    assert "ip -n hpv-node2 addr add 10.213.9.4/24 dev eth0" in cmds
    assert sum("netem delay 20us rate 10gbit" in c for c in cmds) == 3
    argv = plan_run(spec, 2, ["python", "x.py"], "/opt/mpich/bin/mpiexec")
    assert argv[argv.index("-hosts") + 1] == "vnode0:2,vnode1:2,vnode2:2"
    assert argv[argv.index("-localhost") + 1] == "10.213.9.1" and argv[-3:] == [
        "6",
        "python",
        "x.py",
    ]
    cyclic = plan_run(spec, 2, ["python", "x.py"], "/opt/mpich/bin/mpiexec", cyclic=True)
    assert cyclic[cyclic.index("-hosts") + 1] == "vnode0:1,vnode1:1,vnode2:1"
    assert cyclic[cyclic.index("-n") + 1] == "6"


@pytest.mark.slow
def test_bad_input_is_one_line():
    for args, message in (
        (["vcluster", "up", "--nodes", "0"], "--nodes: expected an integer from 1 to 64"),
        (["vcluster", "up", "--nodes", "2", "--link", "fast"], "bad --link"),
        (["vcluster", "up", "--nodes", "2", "--subnet", "192.168.1"], "bad --subnet"),
        (["vcluster"], "name an action"),
        (["bench", "collectives", "--vcluster", "2"], "expected NODESxRANKS such as 2x2"),
        (["bench", "collectives", "--vcluster", "2x2", "--layout", "ppn:2"], "drop --layout"),
        (["bench", "collectives", "--vcluster", "2x2", "--link", "x"], "bad --link"),
    ):
        proc = hpcpar(*args)
        assert proc.returncode == 2, proc.stderr
        first_error = next(line for line in proc.stderr.splitlines() if "error:" in line)
        assert first_error.count(message) == 1
        assert "Traceback" not in proc.stderr


def test_without_privileges_nothing_is_made(monkeypatch):
    from hpcpar.vcluster import netns

    before = leftovers() if shutil.which("ip") else []
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)  # an ordinary user
    with pytest.raises(VClusterError, match="needs root"):
        netns.cluster_up(ClusterSpec(2, "20us,1gbit"))
    assert (leftovers() if shutil.which("ip") else []) == before


@pytest.fixture
def cluster():
    hpcpar("vcluster", "down")  # a cluster left by an interrupted run must not fail this one
    try:
        up = hpcpar("vcluster", "up", "--nodes", "2", "--link", "50us,1gbit")
        assert up.returncode == 0, up.stderr
        yield
    finally:
        down = hpcpar("vcluster", "down")
        assert down.returncode == 0, down.stderr
        assert leftovers() == []


@needs_namespaces
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_collectives_across_tcp_node_boundaries(cluster):
    assert "already up" in hpcpar("vcluster", "up", "--nodes", "2").stderr
    tests = [
        f"tests/hpcpar/test_{name}.py"
        for name in ("collectives_reduce", "collectives_data", "topology")
    ]
    selection = "None or ppn:2 or test_hierarchy or test_alltoall"
    proc = hpcpar(
        "vcluster",
        "run",
        "--ppn",
        "2",
        "--timeout",
        "500",
        "--",
        "python",
        "-m",
        "pytest",
        "--with-mpi",
        "-m",
        "mpi",
        "-q",
        "-p",
        "no:cacheprovider",
        *tests,
        "-k",
        selection,
        timeout=560,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
    demo = hpcpar(
        "vcluster",
        "run",
        "--ppn",
        "2",
        "--timeout",
        "120",
        "--",
        "demo",
        "--count",
        "10000",
        "--no-tour",
    )
    assert demo.returncode == 0 and "on 2 node(s), even (real nodes)" in demo.stdout
    assert "vnode0" in demo.stdout and "vnode1" in demo.stdout
    where = (  # rank 0 prints every rank's host (lines of 4 ranks could interleave)
        "import socket, hpcpar; hosts = hpcpar.default_comm().gather(socket.gethostname()); "
        "print('hosts', *hosts) if hosts else None"
    )
    cyclic = hpcpar(
        "vcluster",
        "run",
        "--ppn",
        "2",
        "--distribution",
        "cyclic",
        "--timeout",
        "60",
        "--",
        "python",
        "-c",
        where,
        timeout=90,
    )
    placed = [line.split()[1:] for line in cyclic.stdout.splitlines() if line[:6] == "hosts "]
    assert placed == [["vnode0", "vnode1", "vnode0", "vnode1"]], cyclic.stdout + cyclic.stderr


@needs_namespaces
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_allreduce_over_three_nodes_across_tcp():
    """Three leaders (not a power of two: the ring among them for large vectors) over TCP."""
    hpcpar("vcluster", "down")
    try:
        up = hpcpar("vcluster", "up", "--nodes", "3", "--link", "50us,1gbit")
        assert up.returncode == 0, up.stderr
        proc = hpcpar(
            "vcluster",
            "run",
            "--ppn",
            "1",
            "--timeout",
            "200",
            "--",
            "python",
            "-m",
            "pytest",
            "--with-mpi",
            "-m",
            "mpi",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/hpcpar/test_collectives_reduce.py",
            "-k",
            "test_allreduce_against_numpy",
            timeout=260,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert " passed" in proc.stdout and "failed" not in proc.stdout
    finally:
        down = hpcpar("vcluster", "down")
        assert down.returncode == 0, down.stderr
    assert leftovers() == []


def test_run_without_a_cluster_is_an_error():
    if leftovers():
        pytest.skip("a virtual cluster is up")
    proc = hpcpar("vcluster", "run", "--", "demo")
    assert proc.returncode == 2 and "no virtual cluster is up" in proc.stderr


@needs_namespaces
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_experiment_sweep_brings_its_cluster_up_and_down(tmp_path):
    import json

    hpcpar("vcluster", "down")
    config = tmp_path / "vc.toml"
    config.write_text(f"""
[experiment]
results = "{tmp_path / "res"}"
timeout = 120
oversubscribe = true
where = "vcluster"

[vcluster]
nodes = 2
link = "50us,1gbit"

[sweep]
command = "bench allreduce-mpi --min-size {{size}} --max-size 64 --repeats 2 --output {{out}}"
ranks = [2, 4]
size = ["8", "bogus"]
""")
    proc = hpcpar("experiment", "run", str(config), timeout=560)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the 'bogus' points failed
    assert "2 ok, 2 failed" in proc.stdout
    assert leftovers() == []  # brought down after the sweep
    rows = json.loads((tmp_path / "res" / "results.json").read_text())
    ok = [r for r in rows["results"] if r["status"] == "ok"]
    assert {r["ranks"] for r in ok} == {2, 4} and all(r["valid"] for r in ok)
    for folder in (tmp_path / "res" / "points").iterdir():
        status = json.loads((folder / "status.json").read_text())
        assert status["where"] == "vcluster" and "vcluster" in status["argv"]
        if status["status"] == "ok":
            meta = json.loads((folder / "out.json").read_text())["metadata"]
            assert meta["host"] == "vnode0" and meta["ranks"] == status["params"]["ranks"]
    # a cluster of another shape that is up is neither used nor taken down
    assert hpcpar("vcluster", "up", "--nodes", "3").returncode == 0
    try:
        proc = hpcpar("experiment", "run", str(config))
        assert proc.returncode == 2 and "a virtual cluster of 3 node(s)" in proc.stderr
        assert "hpv-node2" in leftovers()
    finally:
        hpcpar("vcluster", "down")
    assert leftovers() == []


@needs_namespaces
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_collectives_on_the_vcluster_in_one_command(tmp_path):
    """``bench collectives --vcluster 2x2``: cluster up, calibrate, sweep, down."""
    import json

    hpcpar("vcluster", "down")
    out = tmp_path / "vc"
    proc = hpcpar(
        "bench",
        "collectives",
        "--vcluster",
        "2x2",
        "--distribution",
        "cyclic",
        "--link",
        "50us,1gbit",
        "--no-gloo",
        "--algorithms",
        "auto,two_level",
        "--min-size",
        "64KiB",
        "--max-size",
        "64KiB",
        "--repeats",
        "1",
        "--min-time",
        "0.01",
        "--output",
        str(out),
        timeout=560,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert leftovers() == []
    doc = json.loads((tmp_path / "vc.json").read_text())
    assert doc["metadata"]["ranks"] == 4
    rows = {row["variant"]: row for row in doc["results"]}
    assert {"mpi-direct", "auto", "two_level"} <= set(rows)
    assert all(row["valid"] for row in rows.values())
    assert rows["two_level"]["predicted_us"] > 0  # the profile calibrated on the cluster
    profile = json.loads((tmp_path / "vc-profile.json").read_text())
    assert profile["calibrated"] and "calibrated on vnode" in profile["name"]
    assert profile["mpi_library"]["allreduce"]["ranks"] == 4


def test_the_command_run_again_inside_the_cluster_keeps_its_own_options():
    from hpcpar.bench.on_vcluster import _own_arguments

    argv = [
        "/x/hpcpar",
        "bench",
        "sgd",
        "--vcluster",
        "2x1",
        "--model",
        "mlp",
        "--link=1us,1gbit",
        "--output",
        "o",
        "--distribution",
        "cyclic",
        "--epochs",
        "1",
    ]
    assert _own_arguments(argv, "sgd") == ["--model", "mlp", "--epochs", "1"]
