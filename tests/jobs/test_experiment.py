"""The experiment runner: sweeps that resume, record failures, gather and report."""

from __future__ import annotations

import json

import pytest

from hpcpar.cli.experiment import load_config, points, run_sweep
from hpcpar.cli.main import main
from hpcpar.errors import UsageError

pytestmark = pytest.mark.slow  # starts whole jobs: left out of dev.py test --quick

SWEEP = '''
[experiment]
name = "tiny"
results = "{results}"
timeout = 120
oversubscribe = true

[sweep]
command = """bench allreduce-mpi --min-size {{size}} --max-size 64 --repeats 2 \\
  --min-time 0.001 --output {{out}}"""
ranks = [1, 2]
size = ["8", "bogus"]
'''


def _config(tmp_path, text=SWEEP, name="x.toml"):
    path = tmp_path / name
    path.write_text(text.format(results=tmp_path / "res"))
    return path


@pytest.mark.timeout(600)
def test_sweep_records_failures_resumes_and_reports(tmp_path, capsys):
    config = load_config(_config(tmp_path))
    ids = [p["id"] for p in points(config)]
    assert len(ids) == 4 and len(set(ids)) == 4
    first = run_sweep(config, say=lambda *a: None)
    assert first == {"ok": 2, "failed": 2, "skipped": 0}  # 'bogus' is not a size
    root = tmp_path / "res"
    rows = json.loads((root / "results.json").read_text())["results"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["ranks"] for r in ok} == {1, 2} and all(r["valid"] for r in ok)
    assert {r["size"] for r in ok} == {8, 16, 32, 64}  # the benchmark's own rows, gathered
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 2
    status = json.loads((root / "points" / failed[0]["point"] / "status.json").read_text())
    assert status["exit_code"] == 2 and "bogus" in open(status["log"]).read()
    # an interrupted sweep: one finished point lost its status; a rerun redoes only it
    done = [p for p in ids if "_size-8-" in p]
    (root / "points" / done[0] / "status.json").unlink()
    again = run_sweep(config, say=lambda *a: None)
    assert again == {"ok": 1, "failed": 2, "skipped": 1}
    assert main(["experiment", "report", str(root)]) == 0
    pngs = sorted(root.glob("*.png"))  # time vs size at 1 and 2 ranks, speedup vs ranks
    assert len(pngs) == 3 and all(p.stat().st_size > 5000 for p in pngs)
    assert (root / "speedup-vs-ranks.png") in pngs
    rows = json.loads((root / "results.json").read_text())["results"]
    timed = {r["ranks"]: r for r in rows if r["speedup"] is not None}
    assert set(timed) == {1, 2} and timed[1]["speedup"] == 1.0
    assert timed[2]["speedup"] == pytest.approx(timed[1]["seconds"] / timed[2]["seconds"])
    assert timed[1]["series"] == timed[2]["series"] == "layout=real, size=8"
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    summary = (root / "summary.md").read_text()
    assert summary.count("| failed |") == 2 and summary.count("| ok |") == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[sweep\ncommand = 'x'", "is not valid TOML"),
        (
            "[experiment]\nnmae = 'x'\n[sweep]\ncommand = 'demo'\nranks = [1]",
            r"unknown key\(s\) \['nmae'\] in \[experiment\]; valid: name, oversubscribe",
        ),
        ("[sweeps]\ncommand = 'demo'", r"unknown table\(s\) \['sweeps'\]"),
        ("[sweep]\ncommand = 'demo'\nranks = [0]", "positive integers"),
        ("[sweep]\ncommand = 'bench {what}'\nranks = [1]", r"uses \{what\}"),
        ("[sweep]\ncommand = 'demo'\nranks = [1, 4096]", "set oversubscribe = true"),
        (
            "[experiment]\nwhere = 'cloud'\n[sweep]\ncommand = 'demo'\nranks = [1]",
            "where = 'cloud'; valid: local, vcluster, slurm",
        ),
        (
            "[vcluster]\nnodse = 2\n[sweep]\ncommand = 'demo'\nranks = [1]",
            r"unknown key\(s\) \['nodse'\] in \[vcluster\]; valid: link, nodes",
        ),
        (
            "[experiment]\nwhere = 'vcluster'\n[sweep]\ncommand = 'demo'\nranks = [2, 3]",
            r"ranks \[3\] do not divide over the virtual cluster's 2 node",
        ),
        (
            "[experiment]\nwhere = 'vcluster'\n[sweep]\ncommand = 'demo'\nranks = [2]\n"
            "layout = ['ppn:1']",
            "remove layout from",
        ),
        (
            "[slurm]\nlauncher = 'ssh'\n[sweep]\ncommand = 'demo'\nranks = [1]",
            "srun or mpiexec, not 'ssh'",
        ),
        ("[slurm]\ntime = 'soon'\n[sweep]\ncommand = 'demo'\nranks = [1]", "--time must be"),
        (
            "[slurm]\nsbatch_args = '--qos=x'\n[sweep]\ncommand = 'demo'\nranks = [1]",
            "list of strings",
        ),
    ],
)
def test_bad_configs_are_refused_with_what_is_wrong(tmp_path, text, message):
    with pytest.raises(UsageError, match=message):
        load_config(_config(tmp_path, text.replace("{", "{{").replace("}", "}}")))


def test_where_from_the_command_line_overrides_the_config(tmp_path):
    text = "[experiment]\nwhere = 'slurm'\n[slurm]\nppn = 2\n[sweep]\ncommand = 'demo'\nranks = [4]"
    path = _config(tmp_path, text)
    assert load_config(path)["where"] == "slurm"  # any rank count: Slurm's cores, not ours
    with pytest.raises(UsageError, match="set oversubscribe"):  # but locally, ours
        load_config(path, where="local")
    from hpcpar.cli.sweep_where import slurm_script

    config = load_config(path)
    point = points(config)[0]
    script = slurm_script(config, point, tmp_path, ["demo", "--count", "5"])
    assert "#SBATCH --ntasks=4\n" in script and "#SBATCH --nodes=2\n" in script
    assert 'launch -n "$SLURM_NTASKS" --timeout 600.0 --launcher srun -- demo --count 5' in script


def test_cli_errors_are_one_line_status_2(tmp_path, capsys):
    assert main(["experiment", "run", str(tmp_path / "missing.toml")]) == 2
    assert main(["experiment", "report", str(tmp_path)]) == 2
    assert "run the sweep" in capsys.readouterr().err


def test_example_configs_are_valid():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "jobs" / "experiments"
    configs = sorted(folder.glob("*.toml"))
    assert len(configs) >= 3
    for path in configs:
        assert points(load_config(path)), path


def test_graph_sweeps_get_a_teps_per_partition_plot(tmp_path):
    from hpcpar.cli.experiment import report
    from hpcpar.runtime.results import write_json

    rows = [
        {
            "point": f"p{k}",
            "status": "ok",
            "results": 1,
            "ranks": ranks,
            "layout": "ppn:1",
            "partition": part,
            "bfs_harmonic_mean_teps": 1e6 * (k + 1),
            "sssp_harmonic_mean_teps": 1e5 * (k + 1),
        }
        for k, (ranks, part) in enumerate(
            (r, p) for r in (2, 4) for p in ("1d-vertex", "2d", "hier")
        )
    ]
    write_json(tmp_path / "results.json", rows, comm=None)
    written = report(tmp_path)
    png = tmp_path / "teps-per-partition.png"
    assert png in written and (tmp_path / "summary.md").exists()
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
