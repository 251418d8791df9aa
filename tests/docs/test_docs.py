"""The documentation cannot drift from the code: it builds with warnings as errors, every
``python`` example in it runs (at two ranks, two virtual nodes), and every ``hpcpar``
command line in it is accepted by the real parser."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from launching import clean_env

from hpcpar.cli.main import build_parser
from hpcpar.errors import UsageError
from hpcpar.plugins import commands

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "BENCHMARKS.md"]
FENCE = re.compile(r"^```([\w{}-]*)[^\n]*\n(.*?)^```", re.M | re.S)


def blocks(page: Path, languages: tuple[str, ...]) -> list[str]:
    """The fenced code blocks of ``page`` in one of ``languages``, in order."""
    return [body for lang, body in FENCE.findall(page.read_text()) if lang in languages]


def command_lines(page: Path) -> list[str]:
    """Every ``hpcpar ...`` line of the page's shell blocks (continuations joined)."""
    out = []
    for body in blocks(page, ("sh", "bash", "console")):
        for raw in body.replace("\\\n", " ").splitlines():
            line = raw.split(" #")[0].strip().removeprefix("$ ")
            if line.startswith((".venv/bin/hpcpar ", "hpcpar ")):
                out.append(line.removeprefix(".venv/bin/"))
    return out


def _parse(argv: list[str]) -> None:
    """Parse like the command line; for ``launch``, the hpcpar command after ``--`` too."""
    args = build_parser().parse_args(argv)
    if args.hpcpar_command == "launch":
        inner = list(args.command)
        inner = inner[1:] if inner[:1] == ["--"] else inner
        if inner and inner[0] in commands():
            _parse(inner)


def test_the_docs_build_with_warnings_as_errors(tmp_path):
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            str(ROOT / "docs"),
            str(tmp_path / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "html" / "api.html").exists()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_line_in_the_docs_parses(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # parsing makes output folders (and tries a file there)
    bad = []
    for line in command_lines(page):
        try:
            _parse(shlex.split(line)[1:])
        except (UsageError, SystemExit) as exc:
            bad.append(f"{line}\n    {exc}")
    assert not bad, "\n".join(bad)


EXAMPLES = [p for p in PAGES if blocks(p, ("python",))]


@pytest.mark.slow
@pytest.mark.parametrize("page", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_example_in_the_docs_runs(page, tmp_path):
    script = tmp_path / "examples.py"
    script.write_text("\n\n".join(blocks(page, ("python",))))
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcpar",
            "launch",
            "-n",
            "2",
            "--layout",
            "ppn:1",
            "--timeout",
            "300",
            "--",
            "python",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
        env=clean_env(),
    )
    assert ran.returncode == 0, f"{page.name} examples failed:\n{ran.stdout}\n{ran.stderr}"


def test_a_broken_example_or_command_line_fails(tmp_path):
    page = tmp_path / "broken.md"
    page.write_text("```sh\nhpcpar launch -n 2 -- explain allreduce 1MiB --no-such-flag\n```\n")
    with pytest.raises(UsageError):
        for line in command_lines(page):
            _parse(shlex.split(line)[1:])
    assert blocks(page, ("python",)) == []
