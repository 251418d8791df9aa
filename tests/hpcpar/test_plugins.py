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
        return subprocess.run([sys.executable, "-m", "hpcpar", *args], capture_output=True,
                              text=True, env=env, timeout=120)  # fmt: skip

    ran = hpcpar("toy", "--word", "plugins")
    assert ran.returncode == 0 and "toy says plugins" in ran.stdout, ran.stderr
    assert "a command from another package" in hpcpar("--help").stdout
    assert "a benchmark from another package" in hpcpar("bench", "--help").stdout
    probe = hpcpar("info")  # the apps are still there beside it
    assert probe.returncode == 0, probe.stderr
    listed = subprocess.run(
        [sys.executable, "-c", "from hpcpar.plugins import tour_steps; "
         "print([s.name for s in tour_steps()][-1])"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert listed.stdout.strip() == "toy step", listed.stderr


def test_a_broken_plugin_is_named_and_the_rest_still_works(tmp_path):
    (tmp_path / "brokenapp.py").write_text("raise ImportError('missing dependency xyz')\n")
    info = tmp_path / "brokenapp-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenapp\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hpcpar.plugins]\nbroken = brokenapp\n")
    env = clean_env(PYTHONPATH=str(tmp_path))
    ran = subprocess.run([sys.executable, "-m", "hpcpar", "--help"], capture_output=True,
                         text=True, env=env, timeout=120)  # fmt: skip
    assert ran.returncode == 0
    assert "plugin 'broken' (brokenapp) failed to load: ImportError: missing dependency" in (
        ran.stderr
    )
    assert "cfr" in ran.stdout
