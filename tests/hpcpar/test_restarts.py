"""``hpcpar launch --restarts``: a failed job starts again and resumes from its checkpoints.

Every job here is compared with the same job run without failures: the restarted run's
final state must be bitwise the same (same rank count, reproducible reductions).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hpcpar.checkpoint.faults import parse_fault

from hpcpar.launcher import Attempt
from hpcpar.restarts import MAX_BACKOFF, RestartReport, backoff_delay, restartable

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


def test_a_restart_is_at_once_and_only_quick_failures_in_a_row_back_off_doubling():
    assert [backoff_delay(k, 1.0) for k in (1, 2, 3, 4)] == [0.0, 1.0, 2.0, 4.0]
    assert backoff_delay(40, 1.0) == MAX_BACKOFF
    assert backoff_delay(3, 0.0) == 0.0


@pytest.mark.parametrize(
    ("status", "interrupted", "again"),
    [
        (0, False, False),
        (2, False, False),
        (3, False, True),
        (1, False, True),
        (4, False, True),
        (124, True, False),
        (3, True, False),
    ],
)
def test_what_is_restarted(status, interrupted, again):
    """Failures are restarted; success, bad input (2) and a stopped job are not."""
    assert restartable(Attempt(status, 0.0, 1.0, interrupted=interrupted)) is again


def test_the_report_names_each_restart_and_its_phases():
    from hpcpar.restarts import Recovery

    report = RestartReport(2, status=0, seconds=9.5)
    report.recoveries.append(Recovery(1, [1], "rank(s) 1 left", 3, 4.0, 0.15, 0.0, 1.2, 1.4))
    lines = report.lines()
    assert lines[0] == "the job ended with status 0 after 1 restart(s) (9.5 s in all)"
    assert lines[1] == (
        "restart 1: rank(s) 1 failed after 4.0 s (status 3); teardown 0.15 s, back-off "
        "0.00 s, new start 1.20 s, down 1.40 s"
    )
    report.gave_up, report.status = True, 3
    assert report.lines()[0].startswith("gave up after 1 restart(s) of 2 allowed; the last start")
    assert json.loads(json.dumps(report.to_json()))["recoveries"][0]["failed"] == [1]


def test_several_faults_and_the_start_each_fires_in(monkeypatch):
    fault = parse_fault("kill=write,step=3,rank=1;kill=before-commit,step=5,rank=2,restart=1")
    assert [f.restart for f in (fault, *fault.also)] == [0, 1]
    monkeypatch.delenv("HPCPAR_RESTART", raising=False)
    assert fault.hits(3, 1) and not fault.also[0].hits(5, 2)
    monkeypatch.setenv("HPCPAR_RESTART", "1")
    assert not fault.hits(3, 1) and fault.also[0].hits(5, 2)
    from hpcpar.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="restart must be an integer"):
        parse_fault("kill=write,restart=x")
    with pytest.raises(CheckpointError, match="after must be seconds >= 0"):
        parse_fault("kill=write,after=-1")
    assert parse_fault("kill=write,after=0.5").after == 0.5
    with pytest.raises(CheckpointError, match="give rank=R or node=N, not both"):
        parse_fault("kill=write,rank=1,node=0")
    node = parse_fault("kill=snapshot,node=1")
    node.bind(0, Path("/nonexistent"))
    monkeypatch.delenv("HPCPAR_RESTART")
    assert not node.hits(1, 1)  # rank 1 of node 0 is not on node 1
    node.bind(1, Path("/nonexistent"))
    assert node.hits(1, 0)


def _launch(*args: str, env=None, timeout: float = 150):
    from launching import clean_env, hpcpar

    return hpcpar("launch", *args, env=env or clean_env(), timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_killed_rank_and_a_second_failure_during_recovery_resume_bitwise(tmp_path):
    """Three ranks on two virtual nodes: rank 1 dies half way through writing step 3, and
    in the restarted job rank 2 dies half way through writing step 6; with two restarts allowed
    the job finishes with the bits of a run without failures, resuming from the
    node-local level each time."""
    from launching import clean_env

    job = [sys.executable, str(HELPERS / "ckpt_job.py")]
    args = ["8", "memory,local", "nodes:2,1"]
    plain = _launch("-n", "3", "--", *job, str(tmp_path / "plain"), *args, str(tmp_path / "p.npy"))
    assert plain.returncode == 0, plain.stderr
    faults = "kill=write,step=3,rank=1;kill=write,step=6,rank=2,restart=1"
    report = tmp_path / "report.json"
    restarts = ["--restarts", "2", "--restart-report", str(report)]
    job += [str(tmp_path / "ck"), *args, str(tmp_path / "out.npy")]
    traced = clean_env(HPCPAR_CHECKPOINT_FAULT=faults, HPCPAR_TRACE=str(tmp_path / "trace"))
    run = _launch("-n", "3", *restarts, "--", *job, env=traced)
    assert run.returncode == 0, run.stderr
    assert np.array_equal(np.load(tmp_path / "p.npy"), np.load(tmp_path / "out.npy"))
    starts = [line for line in run.stdout.splitlines() if line.startswith(("fresh", "resumed"))]
    local = ",".join(["local"] * 3)
    assert starts == ["fresh", f"resumed 2 {local}", f"resumed 5 {local}"], run.stdout
    said = json.loads(report.read_text())
    assert said["status"] == 0 and not said["gave_up"]
    assert [r["failed"] for r in said["recoveries"]] == [[1], [2]]
    for recovery in said["recoveries"]:
        assert recovery["status"] == 3 and recovery["wait"] >= 0
        assert recovery["teardown"] >= 0 and 0 < recovery["start"] <= recovery["down"]
    assert "restart 1 of 2 (rank(s) 1 failed, status 3)" in run.stderr
    assert "restart 2 of 2 in 1 s (rank(s) 2 failed, status 3)" in run.stderr
    assert "the job ended with status 0 after 2 restart(s)" in run.stderr
    # the last start's flight records say which start they are and what it resumed from
    from launching import hpcpar as run_hpcpar

    shown = run_hpcpar("trace", str(tmp_path / "trace" / "restart2"))
    assert shown.returncode == 0, shown.stderr
    assert "restart 2 of the job, after rank(s) 2 failed" in shown.stdout
    assert "resumed from step 5 (local)" in shown.stdout


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("fault", "resumed"),
    [
        ("kill=snapshot,step=3,rank=1", (2,)),
        ("kill=before-commit,step=3,rank=0", (2,)),
        ("between saves", (2, 3)),  # step 3's flush runs beside step 4: committed or not
    ],
)
def test_a_rank_killed_before_a_save_commits_or_between_saves_resumes_bitwise(
    tmp_path, fault, resumed
):
    """Two ranks on two virtual nodes, killed before step 3 is committed (snapshot,
    before the commit marker) or in the computation of step 4: the restart resumes from
    the last committed step and ends with the bits of a run without failures."""
    from launching import clean_env

    job = [sys.executable, str(HELPERS / "ckpt_job.py")]
    args = ["6", "memory,local", "ppn:1"]
    plain = _launch("-n", "2", "--", *job, str(tmp_path / "plain"), *args, str(tmp_path / "p.npy"))
    assert plain.returncode == 0, plain.stderr
    env = clean_env(CKPT_JOB_DIE="4") if fault == "between saves" else None
    env = env or clean_env(HPCPAR_CHECKPOINT_FAULT=fault)
    job += [str(tmp_path / "ck"), *args, str(tmp_path / "out.npy")]
    run = _launch("-n", "2", "--restarts", "1", "--", *job, env=env)
    assert run.returncode == 0, run.stderr
    starts = [line for line in run.stdout.splitlines() if line.startswith(("fresh", "resumed"))]
    assert starts[0] == "fresh" and starts[1] in {f"resumed {s} local,local" for s in resumed}
    assert np.array_equal(np.load(tmp_path / "p.npy"), np.load(tmp_path / "out.npy"))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_sgd_app_resumes_by_itself_and_its_results_say_so(tmp_path):
    from launching import clean_env

    train = [sys.executable, "-m", "hpcpar", "sgd", "--dataset", "wine", "--model", "mlp"]
    train += ["--hidden", "8", "--epochs", "3", "--batch", "16", "--lr", "0.05"]
    plain = _launch("-n", "2", "--layout", "ppn:1", "--", *train, "--out", str(tmp_path / "p.json"))
    assert plain.returncode == 0, plain.stderr
    train += ["--out", str(tmp_path / "r.json"), "--checkpoint", str(tmp_path / "ck")]
    fault = clean_env(HPCPAR_CHECKPOINT_FAULT="kill=after-commit,step=10,rank=1")
    restarted = ["-n", "2", "--layout", "ppn:1", "--restarts", "1"]
    run = _launch(*restarted, "--", *train, "--checkpoint-every", "5", env=fault)
    assert run.returncode == 0, run.stderr
    assert "# resumed at step 10" in run.stdout
    assert np.array_equal(np.load(tmp_path / "p.npy"), np.load(tmp_path / "r.npy"))
    meta = json.loads((tmp_path / "r.json").read_text())["metadata"]
    assert meta["restart"] == 1 and meta["restart_failed"] == "1"
    assert meta["resumed_from"] == {"step": 10, "levels": ["local"]}
    assert json.loads((tmp_path / "p.json").read_text())["metadata"]["restart"] == 0


ALWAYS_DIES = """
import os, signal
import hpcpar
comm = hpcpar.default_comm()
hpcpar.barrier()
if comm.Get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
hpcpar.barrier()
"""

HANGS_ONCE = """
import os, time
import hpcpar
comm = hpcpar.default_comm()
hpcpar.barrier()
if comm.Get_rank() == 1 and os.environ["HPCPAR_RESTART"] == "0":
    time.sleep(60)
hpcpar.barrier()
print("done in start", os.environ["HPCPAR_RESTART"], "after", os.environ.get("HPCPAR_RESTART_FAILED"), flush=True)
"""  # noqa: E501


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_more_failures_than_restarts_allowed_end_with_the_last_status(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(ALWAYS_DIES)
    run = _launch("-n", "2", "--restarts", "1", "--restart-backoff", "0", "--", str(script))
    assert run.returncode == 3, run.stderr
    assert run.stderr.count("rank(s) 1 left the job without finishing") == 2, run.stderr
    assert "Restarting (1 of 1)" in run.stderr and "Exit status 3" in run.stderr
    assert "gave up after 1 restart(s) of 1 allowed; the last start ended with status 3" in (
        run.stderr
    )


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_hang_the_watchdog_ends_is_restarted(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS_ONCE)
    run = _launch("-n", "2", "--watchdog", "3", "--restarts", "2", "--", str(script))
    assert run.returncode == 0, run.stderr
    assert "done in start 1 after" in run.stdout, run.stdout
    assert "restart 1 of 2" in run.stderr and "after 1 restart(s)" in run.stderr


@pytest.mark.slow
@pytest.mark.timeout(100)
def test_bad_input_is_not_restarted_and_bad_restart_settings_are_one_line():
    from launching import clean_env

    run = _launch("-n", "2", "--restarts", "3", "--", "sgd", "--lr", "-1")
    assert run.returncode == 2 and "restart" not in run.stderr, run.stderr
    bad = _launch("-n", "1", "--restarts", "-1", "--", "info")
    assert bad.returncode == 2 and "--restarts" in bad.stderr and "Traceback" not in bad.stderr
    env = clean_env(HPCPAR_RESTARTS="many")
    bad = _launch("-n", "1", "--", "info", env=env)
    assert bad.returncode == 2, bad.stderr
    assert "HPCPAR_RESTARTS='many': expected a whole number of at least 0" in bad.stderr


def test_the_ranks_and_layout_left_after_nodes_are_lost():
    from hpcpar.restarts import survivors

    assert survivors("nodes:2,1,1", 4, [0]) == (2, "nodes:1,1")
    assert survivors("ppn:2", 6, [1]) == (4, "nodes:2,2")
    assert survivors("roundrobin:2", 4, [0]) == (2, "nodes:2")
    assert survivors(None, 3, [0]) == (0, None)


SGD = ["-m", "hpcpar", "sgd", "--dataset", "wine", "--model", "mlp", "--hidden", "8"]
SGD += ["--epochs", "3", "--batch", "24", "--lr", "0.05", "--reproducible", "--full-data"]


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("spares", [0, 1])
def test_a_lost_node_restarts_on_the_others_or_on_a_spare_and_resumes_bitwise(tmp_path, spares):
    """Four ranks on virtual nodes of 2, 1 and 1 ranks; node 0 dies with its local
    storage half way through a save. Without spares the job restarts on the two ranks
    of the other nodes, with one it restarts on four; either way rank 0's shard comes
    back from its partner copy and the model is bitwise that of a run without failures
    (--reproducible --full-data: the same at any rank count)."""
    from launching import clean_env

    python = [sys.executable, *SGD]
    plain = _launch("-n", "2", "--", *python, "--out", str(tmp_path / "p.json"))
    assert plain.returncode == 0, plain.stderr
    ck = ["--checkpoint", str(tmp_path / "ck"), "--checkpoint-every", "3"]
    ck += ["--checkpoint-levels", "memory,local,partner", "--out", str(tmp_path / "r.json")]
    fault = clean_env(HPCPAR_CHECKPOINT_FAULT="kill=write,step=9,node=0")
    launch = ["-n", "4", "--layout", "nodes:2,1,1", "--restarts", "1", "--spares", str(spares)]
    run = _launch(*launch, "--", *python, *ck, env=fault)
    assert run.returncode == 0, run.stderr
    assert "# resumed at step 6" in run.stdout
    assert np.array_equal(np.load(tmp_path / "p.npy"), np.load(tmp_path / "r.npy"))
    meta = json.loads((tmp_path / "r.json").read_text())["metadata"]
    assert meta["restart"] == 1 and meta["restart_failed"] == "0,1"
    assert meta["resumed_from"] == {"step": 6, "levels": ["local", "partner"]}
    if spares:
        assert meta["ranks"] == 4 and meta["layout"] == "nodes:2,1,1"
        assert "1 spare node(s) in their place" in run.stderr
    else:
        assert meta["ranks"] == 2 and meta["layout"] == "nodes:1,1"
        assert "restarted on the 2 rank(s) of the other nodes (nodes:1,1)" in run.stderr


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_node_lost_with_too_few_ranks_left_is_not_restarted(tmp_path):
    from launching import clean_env

    fault = clean_env(HPCPAR_CHECKPOINT_FAULT="kill=snapshot,step=3,node=1")
    ck = ["--checkpoint", str(tmp_path / "ck"), "--checkpoint-every", "3"]
    launch = ["-n", "3", "--layout", "nodes:1,2", "--restarts", "2", "--min-ranks", "2"]
    run = _launch(*launch, "--", sys.executable, *SGD, *ck, env=fault)
    assert run.returncode == 3, run.stderr
    assert (
        "node(s) 1 lost and no spare node left; 1 rank(s) are left, fewer than --min-ranks 2: "
        "not restarting"
    ) in run.stderr
    assert "gave up after 0 restart(s) of 2 allowed" in run.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_recovery_benchmark_times_a_restart_and_the_peer_and_checks_the_model(tmp_path):
    from launching import hpcpar as run_hpcpar

    out = tmp_path / "rec"
    args = ["bench", "recovery", "--apps", "cfr", "--ranks", "3", "--layout", "nodes:2,1"]
    args += ["--failures", "node", "--kill-step", "3", "--repeats", "1", "--output", str(out)]
    run = run_hpcpar(*args, timeout=280)
    assert run.returncode == 0, run.stderr
    rows = {r["variant"]: r for r in json.loads(out.with_suffix(".json").read_text())["results"]}
    assert set(rows) == {"cfr-node-restart", "cfr-node-by-hand"}
    assert all(r["valid"] and r["avg_us"] > 0 for r in rows.values())
    ratio = rows["cfr-node-by-hand"]["avg_us"] / rows["cfr-node-restart"]["avg_us"]
    assert rows["cfr-node-by-hand"]["vs_peer"] == pytest.approx(ratio)
    bad = run_hpcpar("bench", "recovery", "--apps", "sgd,go")
    assert bad.returncode == 2 and "--apps takes sgd, cfr, not 'sgd,go'" in bad.stderr
