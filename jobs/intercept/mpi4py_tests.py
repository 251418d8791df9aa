"""mpi4py's own collective tests, unchanged, with and without interception at 1-4 ranks.

    pip download mpi4py==VERSION --no-binary mpi4py --no-deps -d /tmp/m4
    tar xzf /tmp/m4/mpi4py-VERSION.tar.gz -C /tmp/m4
    python jobs/intercept/mpi4py_tests.py /tmp/m4/mpi4py-VERSION/test

VERSION is the installed mpi4py's (``python -c "import mpi4py; print(mpi4py.__version__)"``).
For each rank count it runs the buffer, nonblocking, persistent and vector collective
test modules twice, as they are and under ``hpcpar launch --intercept``, and prints the
tests run, failed and skipped, the time, and how many calls hpcpar ran and passed on
(rank 0). It exits 1 when the two runs' counts differ or a run fails, or when hpcpar
ran none of the calls.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULES = (
    "test_cco_buf",
    "test_cco_nb_buf",
    "test_cco_pr_buf",
    "test_cco_vec",
    "test_cco_nb_vec",
    "test_cco_pr_vec",
)


def _run(
    folder: Path, ranks: int, intercept: bool, report: str, modules: list[str]
) -> tuple[str, float, str]:
    command = [sys.executable, "-m", "hpcpar", "launch", "-n", str(ranks), "--timeout", "900"]
    if intercept:
        command.append("--intercept")
    command += ["--", "runtests.py"]
    for module in modules:
        command += ["-i", module]
    env = dict(os.environ, HPCPAR_INTERCEPT_REPORT=report) if intercept else None
    start = time.monotonic()
    job = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env, check=False)
    took = time.monotonic() - start
    text = job.stdout + job.stderr
    ran = re.findall(r"Ran (\d+) tests?", text)
    verdict = re.findall(r"^(OK.*|FAILED.*)$", text, re.MULTILINE)
    summary = f"{ran[0] if ran else '?'} run, {verdict[0] if verdict else 'no result'}"
    if job.returncode != 0:
        summary += f", exit {job.returncode}"
    return summary, took, text


def main() -> None:
    """Run the modules at each rank count, both ways, and compare."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the test/ folder of mpi4py's sources")
    parser.add_argument("--ranks", default="1,2,3,4")
    parser.add_argument(
        "--modules", default=",".join(MODULES), help="test modules (default: the six above)"
    )
    args = parser.parse_args()
    if not (args.folder / "runtests.py").is_file():
        sys.exit(f"mpi4py_tests.py: error: no runtests.py in {args.folder}")
    bad = False
    print("| ranks | without interception | intercepted | calls hpcpar ran / passed on (rank 0) |")
    print("|---|---|---|---|")
    for ranks in (int(r) for r in args.ranks.split(",")):
        with tempfile.TemporaryDirectory() as report:
            modules = args.modules.split(",")
            plain, t_plain, _ = _run(args.folder, ranks, False, report, modules)
            mine, t_mine, text = _run(args.folder, ranks, True, report, modules)
            calls = json.loads((Path(report) / "intercept0.json").read_text())["calls"]
        ran = sum(c["count"] for c in calls if c["route"] == "hpcpar")
        passed = sum(c["count"] for c in calls if c["route"] == "library")
        print(
            f"| {ranks} | {plain}, {t_plain:.1f} s | {mine}, {t_mine:.1f} s | "
            f"{ran:,} / {passed:,} |",
            flush=True,
        )
        if plain != mine or not mine.split(", ")[1].startswith("OK") or ran == 0:
            bad = True
            sys.stderr.write(text[-4000:])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
