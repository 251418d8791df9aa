"""A package outside hpcpar adds a command, a benchmark and a demo step the way the apps do."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from launching import clean_env

from hpcpar.plugins import CORE_MODULES, benchmarks, commands, tour_steps

pytestmark = pytest.mark.slow  # starts whole jobs: left out of dev.py test --quick

TOY = """
from hpcpar.plugins import Benchmark, Command, TourStep, register


def _run(comm, args):
    print(f"toy says {args.word}")


register(Command("toy", "a command from another package",
                 lambda p: p.add_argument("--word", default="hello"), _run))
register(Benchmark("toy", "a benchmark from another package", lambda p: None,
                   lambda comm, args: [], peer="none"))
register(TourStep("toy step", 99, lambda comm, h, folder, say: None))
"""


def test_the_apps_arrive_through_the_entry_point_group():
    assert {"cfr", "graph", "sat", "sgd"} <= set(commands())
    assert {"cfr", "graph", "sat", "sgd"} <= set(benchmarks())
    names = [step.name for step in tour_steps()]
    assert names[0] == "collective + explain" and len(names) == 5
    assert not any("apps" in module for module in CORE_MODULES)


def test_another_package_registers_through_the_same_group(tmp_path):
    (tmp_path / "toyapp.py").write_text(textwrap.dedent(TOY))
    info = tmp_path / "toyapp-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyapp\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hpcpar.plugins]\ntoy = toyapp\n")
    env = clean_env(PYTHONPATH=str(tmp_path))

    def hpcpar(*args):
        return subprocess.run(
            [sys.executable, "-m", "hpcpar", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    ran = hpcpar("toy", "--word", "plugins")
    assert ran.returncode == 0 and "toy says plugins" in ran.stdout, ran.stderr
    assert "a command from another package" in hpcpar("--help").stdout
    assert "a benchmark from another package" in hpcpar("bench", "--help").stdout
    probe = hpcpar("info")  # the apps are still there beside it
    assert probe.returncode == 0, probe.stderr
    listed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from hpcpar.plugins import tour_steps; print([s.name for s in tour_steps()][-1])",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert listed.stdout.strip() == "toy step", listed.stderr


def test_a_broken_plugin_is_named_and_the_rest_still_works(tmp_path):
    (tmp_path / "brokenapp.py").write_text("raise ImportError('missing dependency xyz')\n")
    info = tmp_path / "brokenapp-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenapp\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hpcpar.plugins]\nbroken = brokenapp\n")
    env = clean_env(PYTHONPATH=str(tmp_path))
    ran = subprocess.run(
        [sys.executable, "-m", "hpcpar", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ran.returncode == 0
    assert "plugin 'broken' (brokenapp) failed to load: ImportError: missing dependency" in (
        ran.stderr
    )
    assert "cfr" in ran.stdout


def _parsers(parser, path=()):
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def test_every_numeric_option_is_range_checked():
    from hpcpar.cli.main import build_parser

    raw = [
        f"hpcpar {' '.join(path)} {'/'.join(a.option_strings)}"
        for path, parser in _parsers(build_parser())
        for a in parser._actions
        if a.type in (int, float)
    ]
    assert not raw, "numeric options without a range check:\n" + "\n".join(raw)
    checked = [
        (path, a)
        for path, parser in _parsers(build_parser())
        for a in parser._actions
        if getattr(a.type, "__name__", "") in ("integer", "number")
    ]
    assert len(checked) >= 80
    for _path, action in checked:
        for bad in ("nan", "abc", "1e400x", ""):
            with pytest.raises(Exception, match="expected"):
                action.type(bad)


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cfr", "--iterations", "-3"], "--iterations: expected an integer of at least 1"),
        (["sgd", "--lr", "nan"], "--lr: expected a number above 0"),
        (["sgd", "--lr", "inf"], "--lr: expected a number above 0"),
        (["graph", "bfs", "--scale", "99"], "--scale: expected an integer from 1 to 40"),
        (["sat", "solve", "f.cnf", "--noise", "2"], "--noise: expected a number from 0 to 1"),
        (["bench", "allreduce-mpi", "--repeats", "0"], "--repeats: expected an integer"),
        (["checkpoint", "ls", "x", "--step", "-1"], "--step: expected an integer from 0"),
        (["launch", "-n", "0", "--", "demo"], "-n/--np: expected an integer from 1"),
    ],
)
def test_bad_numbers_are_one_line_errors(argv, message, capsys):
    from hpcpar.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.reliability("bad_input")
def test_outputs_that_cannot_be_written_are_refused_before_the_work(tmp_path, capsys):
    from hpcpar.cli.main import main
    from hpcpar.runtime.results import ResultsError, atomic_write

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for argv in (
        ["sgd", "--out", str(a_file / "x.json")],
        ["cfr", "--policy", str(tmp_path)],
        ["bench", "allreduce-mpi", "--output", "/proc/no/such/place"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("cannot create" in err[0] or "is a folder" in err[0]), err
    with pytest.raises(ResultsError, match="cannot write"):
        atomic_write(a_file / "sub" / "y.json", "{}")
    made = tmp_path / "new" / "deeper" / "r.json"
    assert (
        main(["simulate", "--nodes", "2", "--ppn", "2", "--max-size", "64", "--output", str(made)])
        == 0
    )
    assert made.with_suffix(".csv").exists() or (made.parent / "r.json.csv").exists()
