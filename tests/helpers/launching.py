"""Starting real jobs from tests: ``python -m hpcpar ...`` with a clean environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

JOB_TIMEOUT = 60


def clean_env(**extra: str) -> dict[str, str]:
    """This environment minus any process-manager variables of the test process itself,
    and no PNG plots (``HPCPAR_PLOTS=0``) unless ``extra`` asks for them."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "HPCPAR_"))
    }
    env["HPCPAR_PLOTS"] = "0"
    env.update(extra)
    return env


def hpcpar(*args: str, env: dict[str, str] | None = None, timeout: float = JOB_TIMEOUT):
    """Run ``python -m hpcpar ARGS``; the completed process."""
    return subprocess.run(
        [sys.executable, "-m", "hpcpar", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or clean_env(),
    )


def launch(ranks: int, *command: str, layout: str | None = None, env=None):
    """``hpcpar launch -n RANKS [--layout L] -- COMMAND``; the completed process."""
    extra = ["--layout", layout] if layout else []
    return hpcpar(
        "launch", "-n", str(ranks), "--timeout", str(JOB_TIMEOUT), *extra, "--", *command, env=env
    )


def killed_and_resumed(job, folder, ranks: int, every: int, step: int):
    """``job(ranks, out, *extra, env=None)`` run at 2 ranks saving every ``every`` steps,
    rank 1 killed right after step ``step`` commits, then run again at ``ranks`` ranks
    from the checkpoints (output ``folder/resumed<ranks>.json``); the resumed run."""
    return resumed_after_one_kill(job, folder, (ranks,), every, step)[0]


def resumed_after_one_kill(job, folder, rank_counts, every: int, step: int):
    """As ``killed_and_resumed``, killed once and resumed at each of ``rank_counts``,
    each from its own copy of the checkpoints the killed run left; the resumed runs."""
    left = folder / "ck-killed"
    ck = ["--checkpoint-every", str(every)]
    fault = clean_env(HPCPAR_CHECKPOINT_FAULT=f"kill=after-commit,step={step},rank=1")
    crashed = job(2, folder / "killed.json", "--checkpoint", str(left), *ck, env=fault)
    assert crashed.returncode != 0, crashed.stdout
    runs = []
    for ranks in rank_counts:
        shutil.copytree(left, folder / f"ck{ranks}")
        again = job(
            ranks, folder / f"resumed{ranks}.json", "--checkpoint", str(folder / f"ck{ranks}"), *ck
        )
        assert again.returncode == 0, again.stderr
        runs.append(again)
    return runs
