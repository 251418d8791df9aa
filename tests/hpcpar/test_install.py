"""Both install modes give hpcpar.checkpoint and hpcpar.apps (mapped from top-level folders)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import hpcpar, hpcpar.checkpoint, hpcpar.apps, hpcpar.cli.main; "
    "print(hpcpar.checkpoint.__file__, hpcpar.apps.__file__)"
)


def _probe(env: dict[str, str], cwd: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.slow
def test_regular_install_maps_checkpoint_and_apps(tmp_path):
    target = tmp_path / "site"
    # from a copy without build/: setuptools would reuse what an earlier build left there
    source = tmp_path / "source"
    leftovers = ("build", ".venv", ".git", "*.egg-info", "__pycache__", "demo-results", "results")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*leftovers))
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    assert (target / "hpcpar" / "py.typed").exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    checkpoint, apps = _probe(env, cwd=tmp_path)
    assert Path(checkpoint) == target / "hpcpar" / "checkpoint" / "__init__.py"
    assert Path(apps) == target / "hpcpar" / "apps" / "__init__.py"
    # every module of every package in the source tree is installed, none left out
    for folder, installed in (
        ("hpcpar", "hpcpar"),
        ("checkpoint", "hpcpar/checkpoint"),
        ("apps", "hpcpar/apps"),
    ):
        for module in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in module.parts:
                assert (target / installed / module.relative_to(ROOT / folder)).exists(), module


def test_this_install_maps_checkpoint_and_apps(tmp_path):
    # Run from a folder outside the checkout so the source tree is not on sys.path.
    checkpoint, apps = _probe(dict(os.environ), cwd=tmp_path)
    code = (
        "from importlib import metadata; "
        "print(metadata.distribution('hpcpar').read_text('direct_url.json'))"
    )
    direct = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    text = direct.stdout.strip()
    editable = text != "None" and json.loads(text).get("dir_info", {}).get("editable", False)
    if editable:
        assert Path(checkpoint) == ROOT / "checkpoint" / "__init__.py"
        assert Path(apps) == ROOT / "apps" / "__init__.py"
    else:
        assert Path(checkpoint).parts[-3:] == ("hpcpar", "checkpoint", "__init__.py")
