"""Batch scripts: rendering, and every app's script run by a real local Slurm."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from slurm_cluster import LocalSlurm, why_not

from hpcpar.cli.jobs import APPS, render_sbatch, submit
from hpcpar.cli.main import main
from hpcpar.errors import HpcparError, UsageError

pytestmark = [
    pytest.mark.slow,  # starts whole jobs: left out of dev.py test --quick
    pytest.mark.xdist_group("slurm"),  # one local Slurm at a time
    pytest.mark.alone,  # its jobs share the machine's cores with Slurm's own daemons
]

ROOT = Path(__file__).resolve().parents[2]
HPCPAR = str(Path(sys.executable).with_name("hpcpar"))


def test_rendered_script_has_the_allocation_placeholders_and_the_app():
    text = render_sbatch(
        "cfr", 3, 8, cpus_per_task=2, time_limit="1-02:00:00", partition="short", launcher="mpiexec"
    )
    for line in (
        "#SBATCH --nodes=3",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --time=1-02:00:00",
        "#SBATCH --partition=short",
    ):
        assert line in text.splitlines()
    assert "PLACEHOLDER" in text and "# module load" in text  # commented out, marked
    assert '--launcher "${HPCPAR_LAUNCHER:-mpiexec}"' in text
    assert '  --restarts "${HPCPAR_RESTARTS:-0}" -- cfr --game leduc_poker' in text
    assert "#SBATCH --no-kill" in text.splitlines()
    custom = render_sbatch("sat", 1, 2, app_args=["solve", "my file.cnf", "--timeout", "5"])
    assert " -- sat solve 'my file.cnf' --timeout 5 ||" in custom
    assert "sat generate" not in custom  # the default's preparation goes with the default
    assert "0|10)" in custom  # satisfiable (10) and unknown (0) are both successes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"app": "nope"}, "unknown app 'nope'"),
        ({"nodes": 0}, "at least 1"),
        ({"time_limit": "ten minutes"}, "--time must be"),
        ({"launcher": "aprun"}, "srun or mpiexec"),
    ],
)
def test_bad_script_requests_are_refused(kwargs, message):
    args = {"app": "cfr", "nodes": 1, "ppn": 1, **kwargs}
    with pytest.raises(UsageError, match=message):
        render_sbatch(args.pop("app"), args.pop("nodes"), args.pop("ppn"), **args)


def test_committed_scripts_are_what_the_generator_writes(tmp_path):
    for app in APPS:
        out = tmp_path / f"{app}.sbatch"
        assert (
            main(
                [
                    "jobs",
                    "slurm",
                    "--app",
                    app,
                    "--nodes",
                    "2",
                    "--ppn",
                    "4",
                    "--time",
                    "00:20:00",
                    "--output",
                    str(out),
                ]
            )
            == 0
        )
        assert out.read_text() == (ROOT / "jobs" / "slurm" / f"{app}.sbatch").read_text(), app


def test_submit_without_slurm_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HpcparError, match="sbatch not found"):
        submit(tmp_path / "x.sbatch")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = why_not()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except (RuntimeError, OSError) as exc:
        cluster.stop()
        pytest.skip(f"a local Slurm could not be started here: {exc}")
    yield cluster
    cluster.stop()


def _run_script(slurm, tmp_path, app, launcher="srun", script=None, **extra):
    env = dict(
        slurm.env,
        HPCPAR=HPCPAR,
        HPCPAR_RESULTS=str(tmp_path / "the results"),
        HPCPAR_LAUNCHER=launcher,
        **extra,
    )
    env.pop("HPCPAR_LAYOUT", None)
    script = script or ROOT / "jobs" / "slurm" / f"{app}.sbatch"
    # one node here: the committed scripts ask for 2 x 4; run them as 1 x 4
    args = ["--nodes=1", "--ntasks-per-node=4", f"--chdir={tmp_path}"]
    return submit(script, wait=True, timeout=600, sbatch_args=args, env=env)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("app", "launcher"),
    [
        ("cfr", "srun"),
        ("sgd", "srun"),
        ("sat", "mpiexec"),
        ("bench", "mpiexec"),
        ("graph", "srun"),
        ("demo", "srun"),
    ],
)
def test_each_apps_batch_script_runs_under_slurm(slurm, tmp_path, app, launcher):
    res = _run_script(slurm, tmp_path, app, launcher)
    log = Path(res["log"])
    assert res["state"] == "COMPLETED" and res["exit_code"] == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert f"hpcpar {app}: finished" in text
    out = tmp_path / "the results"  # a space in the path: every path is quoted
    job = res["job"]
    if app == "cfr":
        doc = json.loads((out / f"cfr-{job}.json").read_text())
        assert doc["metadata"]["ranks"] == 4
        assert doc["results"]["iterations"] == 200 and doc["results"]["exploitability"] < 0.05
    elif app == "sgd":
        rows = json.loads((out / f"sgd-{job}.json").read_text())["results"]["epochs"]
        assert len(rows) == 5 and rows[-1]["test_accuracy"] > 0.9
    elif app == "sat":
        assert "s SATISFIABLE" in text and "4 rank(s)" in text
    elif app == "graph":
        doc = json.loads((out / f"graph-{job}.json").read_text())
        assert doc["metadata"]["ranks"] == 4 and doc["results"]["partition"] == "hier"
        assert len(doc["results"]["times"]["sssp"]) == 16  # validated: a failure exits 2
    elif app == "bench":
        rows = json.loads((out / f"bench-{job}.json").read_text())["results"]
        assert rows and all(r["valid"] for r in rows)
    else:
        doc = json.loads((out / f"demo-{job}.json").read_text())
        assert doc["results"]["passed"] and len(doc["results"]["checks"]) > 5


def test_a_batch_step_that_loses_a_rank_restarts_inside_the_allocation_and_finishes(
    slurm, tmp_path
):
    """sgd.sbatch with HPCPAR_RESTARTS=1: rank 1 is killed after step 50 commits, srun
    ends the step, hpcpar launch starts a second step in the same allocation and the
    training resumes from step 50 to its end."""
    fault = "kill=after-commit,step=50,rank=1"
    res = _run_script(slurm, tmp_path, "sgd", HPCPAR_RESTARTS="1", HPCPAR_CHECKPOINT_FAULT=fault)
    text = Path(res["log"]).read_text()
    assert res["state"] == "COMPLETED" and res["exit_code"] == 0, text[-3000:]
    assert "# resumed at step 50" in text and "after 1 restart(s)" in text, text[-3000:]
    doc = json.loads((tmp_path / "the results" / f"sgd-{res['job']}.json").read_text())
    assert doc["metadata"]["restart"] == 1 and doc["metadata"]["restart_failed"] == "1"
    assert [r["epoch"] for r in doc["results"]["epochs"]] == [1, 2, 3, 4, 5]


def test_a_horovod_script_runs_under_horovodrun_and_srun(slurm, tmp_path):
    pytest.importorskip("torch", reason="hpcpar.horovod.torch needs torch")
    train = tmp_path / "train.py"
    train.write_text(
        "import torch, hpcpar.horovod.torch as hvd\n"
        "hvd.init()\n"
        "x = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)\n"
        "print(f'rank {hvd.rank()} of {hvd.size()} local {hvd.local_rank()} sum {x.item():g}')\n"
    )
    batch = tmp_path / "hvd.sbatch"
    batch.write_text(
        f'#!/bin/bash\nset -e\n"$HPCPAR" horovodrun -np "$SLURM_NTASKS" --verbose '
        f"{sys.executable} {train}\n"
    )
    res = _run_script(slurm, tmp_path, "horovod", script=batch)
    text = Path(res["log"]).read_text()
    assert res["state"] == "COMPLETED" and res["exit_code"] == 0, text[-3000:]
    assert "srun --ntasks=4" in text  # horovodrun inside an allocation: srun
    assert all(f"rank {r} of 4 local {r} sum 6" in text for r in range(4)), text[-3000:]


def test_a_failing_job_is_reported_failed_with_its_log(slurm, tmp_path, capsys):
    script = tmp_path / "bad.sbatch"
    main(
        [
            "jobs",
            "slurm",
            "--app",
            "cfr",
            "--ppn",
            "2",
            "--output",
            str(script),
            "--",
            "--game",
            "no_such_game",
        ]
    )
    res = _run_script(slurm, tmp_path, "cfr", script=script)
    assert res["state"] == "FAILED" and res["exit_code"] == 2
    assert "unknown game 'no_such_game'" in Path(res["log"]).read_text()


SLURM_SWEEP = '''
[experiment]
name = "tiny-slurm"
results = "{results}"
timeout = 120
where = "slurm"

[slurm]
wait = {wait}

[sweep]
command = """bench allreduce-mpi --min-size {{size}} --max-size 64 --repeats 2 \\
  --min-time 0.001 --output {{out}}"""
ranks = [1, 2]
size = ["8", "bogus"]
'''


@pytest.mark.timeout(600)
def test_a_sweep_runs_as_batch_jobs_and_a_rerun_collects_queued_ones(slurm, tmp_path, monkeypatch):
    from hpcpar.cli.experiment import load_config, run_sweep

    for key in ("SLURM_CONF", "PATH"):
        monkeypatch.setenv(key, slurm.env[key])
    monkeypatch.delenv("HPCPAR_LAYOUT", raising=False)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "res"

    def config(wait):
        path = tmp_path / f"sweep-{wait}.toml"
        path.write_text(SLURM_SWEEP.format(results=root, wait=wait))
        return load_config(path)

    # the runner gives up waiting at once: every job stays submitted, nothing is lost
    with pytest.raises(HpcparError, match=r"4 Slurm job\(s\) still queued or running"):
        run_sweep(config(0.01), say=lambda *a: None)
    statuses = {p.parent.name: json.loads(p.read_text()) for p in root.glob("points/*/status.json")}
    assert len(statuses) == 4 and {s["status"] for s in statuses.values()} == {"submitted"}
    # a rerun collects those jobs instead of submitting them again
    counts = run_sweep(config(600), say=lambda *a: None)
    assert counts == {"ok": 2, "failed": 2, "skipped": 0}
    for point, old in statuses.items():
        new = json.loads((root / "points" / point / "status.json").read_text())
        assert new["job"] == old["job"] and new["where"] == "slurm"
        if new["status"] == "failed":  # 'bogus' is not a size: exit 2, said in the job's log
            assert new["exit_code"] == 2 and new["slurm_state"] == "FAILED"
            assert "bogus" in Path(new["log"]).read_text()
        else:
            assert new["seconds"] > 0 and new["slurm_state"] == "COMPLETED"
    rows = json.loads((root / "results.json").read_text())["results"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["ranks"] for r in ok} == {1, 2} and all(r["valid"] for r in ok)
    assert {r["size"] for r in ok} == {8, 16, 32, 64}
    assert {r["ranks"] for r in rows if r["speedup"] is not None} == {1, 2}
    # finished points are not submitted again
    assert run_sweep(config(600), say=lambda *a: None) == {"ok": 0, "failed": 2, "skipped": 2}
