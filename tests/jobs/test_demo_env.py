"""The main job, as ``python3 dev.py demo`` runs it, in an environment holding only what
that command installs: every step of the tour passes and writes its files.

The environment is built by dev.py's own set-up code with the demo's extras, in
``.venv-demo`` (kept while setup.cfg and pyproject.toml are unchanged), never from the
test environment, so a module the demo imports but does not declare fails here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
from launching import clean_env

ROOT = Path(__file__).resolve().parents[2]
DEMO_VENV = ROOT / ".venv-demo"

pytestmark = pytest.mark.slow  # builds an environment and starts whole jobs

SGD_STEP_AGAIN = """
import sys
from pathlib import Path
from hpcpar.apps.sgd.plugin import killed_and_resumed
same, figure = killed_and_resumed(Path(sys.argv[1]))
print(figure)
sys.exit(0 if same else 1)
"""


def load_dev():
    """dev.py, the README's two commands, as a module."""
    spec = importlib.util.spec_from_file_location("hpcpar_dev", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1800)
def test_the_demo_passes_with_only_its_own_setup(tmp_path):
    dev = load_dev()
    dev.setup(dev.DEMO_EXTRAS, DEMO_VENV)
    env = clean_env(HPCPAR_PLOTS="1")  # the demo draws its plots
    env.pop("VIRTUAL_ENV", None)
    argv = dev.demo_argv(DEMO_VENV, "--results", str(tmp_path / "demo-results"))
    proc = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    logs = "\n".join(p.read_text() for p in sorted((tmp_path / "demo-results").glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}\n{logs[-3000:]}"
    assert "demo passed" in proc.stdout and "FAILED" not in proc.stdout
    results = tmp_path / "demo-results"
    steps = json.loads((results / "tour.json").read_text())
    assert [s["step"] for s in steps] == [
        "collective + explain",
        "SGD killed + resumed",
        "CFR on Leduc poker",
        "Graph500 BFS",
        "SAT portfolio",
    ]
    assert all(s["ok"] for s in steps), steps
    assert "bitwise equal" in steps[1]["figure"] and "restarted by launch" in steps[1]["figure"]
    for s in steps:  # every file it points to exists and is not empty
        for name in s["files"]:
            assert (results / name).stat().st_size > 0, name
    png = (results / "cfr.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    python = str(dev.bin_dir(DEMO_VENV) / "python")
    # a second demo in the same results folder kills and restarts afresh (resuming the
    # first demo's finished checkpoint would kill nothing and fail the step)
    again = subprocess.run(
        [python, "-c", SGD_STEP_AGAIN, str(results)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "rank 1 killed, restarted by launch --restarts" in again.stdout, again.stdout
    # the environment really is the demo's: nothing of the test extras is in it
    listed = subprocess.run(
        [python, "-m", "pip", "list"], capture_output=True, text=True, check=True
    ).stdout.lower()
    assert "pytest" not in listed and "torch" not in listed
    assert "scikit-learn" in listed and "matplotlib" in listed
