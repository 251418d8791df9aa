"""The settings table: every HPCPAR_ variable in the code is in it, the docs page is made
from it, and a value that does not parse is one line naming the variable."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcpar.errors import UsageError
from hpcpar.runtime import settings

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["hpcpar", "apps", "checkpoint", "jobs", "dev.py", "tests/conftest.py", "tests/helpers"]
NAME = re.compile(r"HPCPAR_[A-Z0-9_]+")


def _names_in_the_source() -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in SOURCES:
        path = ROOT / entry
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for f in files:
            if f.suffix not in (".py", ".sh", ".sbatch", ".md", "") or "__pycache__" in f.parts:
                continue
            for name in NAME.findall(f.read_text(errors="replace")):
                found.setdefault(name, str(f.relative_to(ROOT)))
    return found


def test_every_hpcpar_name_in_the_source_is_in_the_table():
    names = _names_in_the_source()
    assert "HPCPAR_CHECK" in names and "HPCPAR_ALGORITHM_ALLREDUCE" in names  # the scan works
    missing = {
        n: where
        for n, where in names.items()
        if settings.lookup(n) is None
        and n.rstrip("_") + "_" not in {s.name for s in settings.TABLE}
    }
    assert not missing, f"not in hpcpar/runtime/settings.py: {missing}"


def test_the_docs_page_shows_the_table():
    page = (ROOT / "docs" / "environment.md").read_text()
    assert settings.markdown_table() in page, (
        "docs/environment.md differs from the table: paste "
        "hpcpar.runtime.settings.markdown_table() into it"
    )
    for entry in settings.TABLE:
        assert entry.doc and entry.read in settings.READ_KINDS, entry.name


def test_the_ranks_agree_on_the_tables_agree_entries():
    from hpcpar.collectives.agree import FILE_SETTINGS, SETTINGS

    assert "HPCPAR_ALGORITHM_ALLREDUCE" in SETTINGS and "HPCPAR_LAYOUT" in SETTINGS
    assert set(FILE_SETTINGS) == {"HPCPAR_PROFILE", "HPCPAR_RULES"}
    for entry in settings.TABLE:
        if not entry.name.endswith("_"):
            assert (entry.name in SETTINGS) == entry.agree, entry.name


@pytest.mark.parametrize(
    ("word", "value"),
    [
        ("1", True),
        ("true", True),
        ("Yes", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("OFF", False),
        ("", False),
    ],
)
def test_one_vocabulary_of_true_and_false(word, value):
    assert settings.flag("HPCPAR_CHECK", {"HPCPAR_CHECK": word}) is value
    assert settings.flag("HPCPAR_FLIGHT", {}) is True  # its default


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("HPCPAR_CHECK", "yess", "HPCPAR_CHECK='yess': expected one of 1, true, yes, on, 0,"),
        ("HPCPAR_FLIGHT", "maybe", "HPCPAR_FLIGHT='maybe': expected one of"),
        ("HPCPAR_WATCHDOG", "-3", "HPCPAR_WATCHDOG='-3': expected a number of seconds above 0"),
        ("HPCPAR_TIMEOUT", "soon", "HPCPAR_TIMEOUT='soon': expected a number of seconds above 0"),
        ("HPCPAR_COPY_THREADS", "0", "HPCPAR_COPY_THREADS='0': expected a whole number"),
        ("HPCPAR_SEGMENT_BYTES", "4k", "HPCPAR_SEGMENT_BYTES='4k': expected a whole number"),
        ("HPCPAR_WATCHDOG_ACTION", "reboot", "HPCPAR_WATCHDOG_ACTION='reboot': expected abort or"),
        ("HPCPAR_LAUNCHER", "ssh", "HPCPAR_LAUNCHER='ssh': expected auto or mpiexec or srun"),
    ],
)
def test_a_value_typo_is_refused_naming_the_variable(name, raw, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        settings.value(name, {name: raw})
    with pytest.raises(UsageError, match=re.escape(message)):
        settings.check({name: raw})


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize("variable", ["HPCPAR_FLIGHT=maybe", "HPCPAR_CHECK=yess"])
def test_a_typo_fails_a_command_at_its_start_with_one_line(variable):
    """HPCPAR_FLIGHT is read at import (a typo falls back to on there); every set value is
    checked when hpcpar first uses a communicator: one line, exit status 2."""
    from launching import clean_env

    name, raw = variable.split("=")
    done = subprocess.run(
        [sys.executable, "-m", "hpcpar", "info"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(**{name: raw}),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith(f"hpcpar: error: {name}={raw!r}: expected one of")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_info_names_a_variable_that_is_no_setting():
    from launching import clean_env

    done = subprocess.run(
        [sys.executable, "-m", "hpcpar", "info"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(HPCPAR_CHEK="1"),
    )
    assert done.returncode == 0, done.stderr
    assert "HPCPAR_CHEK (no such setting: a typo?)" in done.stdout, done.stdout
