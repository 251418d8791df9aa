"""The command line end to end: real jobs at 1-4 ranks started through ``hpcpar launch``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from launching import clean_env, hpcpar, launch

from hpcpar.cli.main import main
from hpcpar.errors import UsageError

pytestmark = [pytest.mark.slow]  # starts whole jobs: left out of dev.py test --quick


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["frobnicate"], {}, "invalid choice: 'frobnicate'"),
        (["demo", "--bogus"], {}, "unrecognized arguments: --bogus"),
        (["info", "--layout", "ppn:x"], {}, "malformed layout 'ppn:x'"),
        (["info", "--layout", "nodes:2,1"], {}, "places 3 rank(s) but the job has 4"),
        (["info"], {"HPCPAR_LAYOUT": "roundrobin:9"}, "has 9 nodes but the job has only 4"),
        (["bench", "allreduce-mpi", "--max-size", "12Q"], {}, "bad size '12Q'"),
        (["demo", "--count", "0"], {}, "--count: expected an integer from 1"),
    ],
)
def test_bad_input_exits_2_on_every_rank_with_one_line(tmp_path, args, env, message):
    # Each rank records its own exit status, so "exit 2 on every rank" is checked per rank.
    record = f'{sys.executable} -m hpcpar "$@"; echo $? > {tmp_path}/rc.$PMI_RANK'
    proc = launch(4, "sh", "-c", record, "sh", *args, env=clean_env(**env))
    statuses = sorted(p.read_text().strip() for p in tmp_path.glob("rc.*"))
    assert statuses == ["2"] * 4, (statuses, proc.stderr)
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["launch", "-n", "4", "--", "no_such_script.py"], "script not found: no_such_script.py"),
        (["launch", "-n", "4", "--layout", "nodes:x", "--", "demo"], "malformed layout"),
        (["launch", "-n", "4", "--layout", "nodes:3", "--", "demo"], "job has 4"),
        (["launch", "-n", "0", "--", "demo"], "-n/--np: expected an integer from 1"),
        (["launch", "--", "demo"], "-n/--np"),
        (["launch", "-n", "2", "--timeout", "-1", "--", "demo"], "--timeout: expected a number"),
        (["launch", "-n", "2"], "nothing to run"),
        (["launch", "-n", "99999", "--", "demo"], "ranks per core on the"),
    ],
)
def test_bad_launches(args, message):
    proc = hpcpar(*args)
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_help_is_printed_once(tmp_path):
    proc = launch(3, "python", "-m", "hpcpar", "--help")
    assert proc.returncode == 0
    assert proc.stdout.count("usage: hpcpar") == 1
    for name in ("info", "demo", "launch", "bench"):
        assert name in proc.stdout


def test_demo_on_uneven_virtual_nodes(tmp_path):
    out = tmp_path / "demo.json"
    proc = launch(
        4, "demo", "--count", "5000", "--output", str(out), "--no-tour", layout="nodes:1,3"
    )
    assert proc.returncode == 0, proc.stderr
    assert "demo passed" in proc.stdout and "FAILED" not in proc.stdout
    assert proc.stdout.count("hpcpar topology") == 1 and "tour" not in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["results"]["passed"] is True
    assert doc["metadata"]["ranks"] == 4 and doc["metadata"]["layout"] == "nodes:1,3"


@pytest.mark.timeout(600)
def test_info_in_process(capsys):
    assert main(["info", "--layout", "ppn:1"]) == 0
    text = capsys.readouterr().out
    for key in ("MPI library:", "thread level:", "mpi4py:", "h5py:", "GPU:", "hpcpar topology"):
        assert key in text


def test_one_rank_raising_aborts_the_job(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(
        "import hpcpar\n"
        "comm = hpcpar.default_comm()\n"
        "if comm.Get_rank() == 2:\n"
        "    raise RuntimeError('boom on rank 2')\n"
        "comm.Barrier()\n"
    )
    proc = launch(4, str(script))
    assert proc.returncode not in (0, 124), proc.stderr  # ended by the abort, not the time-out
    assert proc.stderr.count("Traceback") == 1, proc.stderr
    assert "[2/4] RuntimeError: boom on rank 2" in proc.stderr


def test_launch_timeout_kills_the_whole_job(tmp_path):
    script = tmp_path / "sleepy.py"
    script.write_text("import time, hpcpar\nhpcpar.default_comm().Barrier()\ntime.sleep(600)\n")
    proc = hpcpar("launch", "-n", "2", "--timeout", "3", "--", str(script))
    assert proc.returncode == 124
    assert "ran past --timeout 3 s" in proc.stderr


def test_launch_dry_run_shows_the_plan():
    proc = hpcpar("launch", "-n", "8", "--layout", "ppn:4", "--dry-run", "--", "demo")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert "export HPCPAR_LAYOUT=ppn:4" in lines
    command = lines[-1].split()
    assert Path(command[0]).name in ("mpiexec", "mpirun") and command[1:3] == ["-n", "8"]
    assert command[-3:] == ["-m", "hpcpar", "demo"]


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == 2
    assert "no command given" in capsys.readouterr().err


def test_a_rank_that_leaves_early_fails_the_job(tmp_path):
    script = tmp_path / "leave.py"
    script.write_text(
        "import os, numpy as np, hpcpar\n"
        "comm = hpcpar.default_comm()\n"
        "if comm.Get_rank() == 1:\n"
        "    os._exit(0)\n"
        "hpcpar.allreduce(np.ones(4))\n"
    )
    proc = launch(2, sys.executable, str(script))
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    line = next(x for x in proc.stderr.splitlines() if "left the job without finishing" in x)
    assert "rank(s) 1 left the job without finishing (os._exit or a signal)" in line, line
    fine = launch(2, sys.executable, "-c", "import hpcpar; hpcpar.default_comm().Barrier()")
    assert fine.returncode == 0, fine.stderr


def test_the_demo_results_folder_may_exist_already_but_not_be_a_file(tmp_path):
    from hpcpar.cli.main import build_parser

    folder = tmp_path / "demo-results"
    folder.mkdir()
    (folder / "cfr.json").write_text("{}")  # a previous run's files
    args = build_parser().parse_args(["demo", "--results", str(folder)])
    assert args.results == str(folder)
    fresh = tmp_path / "new" / "results"
    assert build_parser().parse_args(["demo", "--results", str(fresh)]).results == str(fresh)
    assert fresh.is_dir()
    plain = tmp_path / "a-file"
    plain.write_text("")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        build_parser().parse_args(["demo", "--results", str(plain)])


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize("args", [["info"], ["checkpoint", "ls", "CKPT"]])
def test_output_to_a_closed_pipe_ends_quietly(tmp_path, args):
    """``hpcpar ... | head -2``: the reader closes the pipe before the command writes; the
    command stops with SIGPIPE's status, as the Unix tools do, and prints no traceback."""
    import subprocess

    from hpcpar.checkpoint import Checkpointer

    root = tmp_path / "ck"
    with Checkpointer(root, comm=None, levels=["local"]) as ck:
        for step in range(1, 40):
            ck.save(step, {"x": step}).wait()
    argv = [sys.executable, "-m", "hpcpar", *(str(root) if a == "CKPT" else a for a in args)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    proc.stdout.close()  # long before the command has imported anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == "", err
