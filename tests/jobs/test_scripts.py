"""The shell scripts under jobs/: each parses, and the GPU check refuses a missing mode."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "jobs").rglob("*.sh"))


def test_there_are_scripts():
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_parses(script):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_gpu_check_needs_a_mode():
    script = ROOT / "jobs" / "local" / "gpu-check.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage:" in done.stderr and "wheels|run" in done.stderr
